"""RDMA port state and counters (sysfs) -> Prometheus metric families, at scrape time.

  tracehound_rdma_port_counter_total{device,port,counter}
      IB PMA counters (ports/<n>/counters), named as sysfs names them.
  tracehound_rdma_port_data_bytes_total{device,port,direction}
      port_xmit_data / port_rcv_data x4: the PMA counts 4-octet words.
  tracehound_rdma_port_hw_counter_total{device,port,counter}
      driver counters (ports/<n>/hw_counters); device-wide ones
      (<dev>/hw_counters) carry port="": IB switches have a real port 0.
  tracehound_rdma_port_state_id{device,port}
  tracehound_rdma_port_physical_state_id{device,port}
      the IB state codes, as node_exporter's node_infiniband_state_id and
      node_infiniband_physical_state_id give them, so `!= 4` alerts carry over.
  tracehound_rdma_port_rate_bytes_per_second{device,port}
  tracehound_rdma_port_info{device,port,link_layer,netdev}     always 1
  tracehound_rdma_port_read_errors_total{reason}
      values skipped since start (see host.rdma_ports for the reasons).

A port whose state could not be read has no state series for that scrape
rather than a made-up value.
"""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..host.rdma_ports import READ_ERROR_REASONS, PortReader, rate_bytes_per_second

PORT_LABELS = ["device", "port"]
DEVICE_LEVEL_PORT = ""
DATA_WORDS = {"port_xmit_data": "transmit", "port_rcv_data": "receive"}
STATE_HELP = "0: nop, 1: down, 2: init, 3: armed, 4: active, 5: active defer"
PHYS_STATE_HELP = ("1: sleep, 2: polling, 3: disabled, 4: port configuration training, "
                   "5: link up, 6: link error recovery, 7: phy test")


class RdmaPortCollector:
    """prometheus_client collector over a PortReader (host.rdma_ports)."""

    name = "rdma_ports"

    def __init__(self, reader: PortReader):
        self.reader = reader

    def collect(self):
        snap = self.reader.read()
        counters = CounterMetricFamily(
            "tracehound_rdma_port_counter",
            "IB port (PMA) counters from sysfs ports/<n>/counters, under the kernel's names. "
            "port_xmit_data and port_rcv_data count 4-octet words (see "
            "tracehound_rdma_port_data_bytes_total); error counters saturate at their width.",
            labels=[*PORT_LABELS, "counter"])
        data = CounterMetricFamily(
            "tracehound_rdma_port_data_bytes",
            "Bytes through the port: the PMA's port_xmit_data / port_rcv_data words x4.",
            labels=[*PORT_LABELS, "direction"])
        hw = CounterMetricFamily(
            "tracehound_rdma_port_hw_counter",
            "Driver counters from sysfs ports/<n>/hw_counters (port=\"\": device-wide "
            "<dev>/hw_counters); which exist depends on the driver.",
            labels=[*PORT_LABELS, "counter"])
        state = GaugeMetricFamily("tracehound_rdma_port_state_id",
                                  f"Logical state of the port ({STATE_HELP}).", labels=PORT_LABELS)
        phys = GaugeMetricFamily("tracehound_rdma_port_physical_state_id",
                                 f"Physical state of the port ({PHYS_STATE_HELP}).",
                                 labels=PORT_LABELS)
        rate = GaugeMetricFamily("tracehound_rdma_port_rate_bytes_per_second",
                                 "Signalling rate of the port's link as the driver reports it.",
                                 labels=PORT_LABELS)
        info = GaugeMetricFamily("tracehound_rdma_port_info",
                                 "An RDMA port: its link layer and, for RoCE, its netdev.",
                                 labels=[*PORT_LABELS, "link_layer", "netdev"])
        for p in snap.ports:
            where = [p.device, str(p.port)]
            info.add_metric([*where, p.link_layer, p.netdev], 1)
            if p.state_id is not None:
                state.add_metric(where, p.state_id)
            if p.phys_state_id is not None:
                phys.add_metric(where, p.phys_state_id)
            speed = rate_bytes_per_second(p.rate)
            if speed is not None:
                rate.add_metric(where, speed)
            for name, value in sorted(p.counters.items()):
                counters.add_metric([*where, name], value)
                if name in DATA_WORDS:
                    data.add_metric([*where, DATA_WORDS[name]], value * 4)
            for name, value in sorted(p.hw_counters.items()):
                hw.add_metric([*where, name], value)
        for device, values in sorted(snap.device_hw_counters.items()):
            for name, value in sorted(values.items()):
                hw.add_metric([device, DEVICE_LEVEL_PORT, name], value)
        yield from (info, state, phys, rate, counters, data, hw)

        errors = CounterMetricFamily(
            "tracehound_rdma_port_read_errors",
            "RDMA sysfs values skipped: malformed (not an unsigned integer or state), "
            "too_large, unreadable, vanished (gone between listing and reading), bad_name.",
            labels=["reason"])
        totals = self.reader.read_errors()
        for reason in READ_ERROR_REASONS:
            errors.add_metric([reason], totals.get(reason, 0))
        yield errors
