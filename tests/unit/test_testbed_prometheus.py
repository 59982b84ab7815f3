"""The tests' Prometheus is their own: when the port picked free is taken by
another server before ours binds it (here one that answers /-/ready as a
Prometheus would), serving() gives that port up for another and yields the
URL of the Prometheus it started, never the other's."""
import http.server
import json
import threading

from testbed import prometheus as prometheus_server


class Impostor(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "success", "data": {"config.file": "/elsewhere.yml"}})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body.encode() if self.path.startswith("/api/") else b"ready")

    def log_message(self, *args):
        pass


def test_a_port_another_server_took_is_given_up(tmp_path, monkeypatch):
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Impostor)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    taken = other.server_address[1]
    picks = iter([taken])
    real_free_port = prometheus_server.free_port
    monkeypatch.setattr(prometheus_server, "free_port", lambda: next(picks, None) or real_free_port())
    try:
        with prometheus_server.serving(tmp_path, {"global": {"scrape_interval": "1s"}}) as url:
            assert url != f"http://127.0.0.1:{taken}"
            assert prometheus_server.answers_for(url, str(tmp_path / "prometheus.yml"))
    finally:
        other.shutdown()
        other.server_close()
