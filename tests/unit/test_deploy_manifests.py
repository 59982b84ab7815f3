"""Kubernetes manifests under deploy/: the fields the API server and kubelet
require, and consistency between them and with the agent's command line
(the systemd unit and the image recipe: test_deploy_host.py)."""
import argparse
import glob
import os
import re

import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT
from tracehound.cli import build_parser
from tracehound.exporter.server import parse_listen

DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "kubernetes")

# Field names of the API objects used here (core/v1, apps/v1): a misspelt field
# is dropped by a lenient API server, so catch it here.
POD_SPEC_FIELDS = {"serviceAccountName", "hostPID", "hostNetwork", "hostIPC", "dnsPolicy",
                   "tolerations", "terminationGracePeriodSeconds", "containers", "volumes",
                   "nodeSelector", "affinity", "priorityClassName", "initContainers",
                   "securityContext", "automountServiceAccountToken", "runtimeClassName"}
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "ports",
                    "startupProbe", "readinessProbe", "livenessProbe", "resources",
                    "securityContext", "volumeMounts", "workingDir", "envFrom"}
PROBE_FIELDS = {"httpGet", "tcpSocket", "exec", "initialDelaySeconds", "periodSeconds", "timeoutSeconds",
                "failureThreshold", "successThreshold", "terminationGracePeriodSeconds"}
MOUNT_FIELDS = {"name", "mountPath", "readOnly", "subPath", "mountPropagation"}
HOST_PATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket",
                   "CharDevice", "BlockDevice"}
# host paths the agent reads, and whether the mount may be read-only
HOST_MOUNTS = {"/sys/fs/bpf": False, "/sys/kernel/tracing": False, "/sys/kernel/btf": True,
               "/sys/fs/cgroup": True, "/var/log/pods": True, "/var/log/containers": True,
               "/var/lib/tracehound": False}


def yaml_files():
    return sorted(glob.glob(os.path.join(DEPLOY, "**", "*.y*ml"), recursive=True))


def k8s_objects():
    out = []
    for path in sorted(glob.glob(os.path.join(K8S, "**", "*.yaml"), recursive=True)):
        if os.path.basename(path) == "kustomization.yaml":
            continue
        with open(path) as f:
            out += [(path, doc) for doc in yaml.safe_load_all(f) if doc]
    return out


def one(kind):
    found = [doc for _, doc in k8s_objects() if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def daemonset():
    return one("DaemonSet")


@pytest.fixture(scope="module")
def pod(daemonset):
    return daemonset["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def container(pod):
    assert len(pod["containers"]) == 1
    return pod["containers"][0]


def test_every_yaml_file_parses():
    assert yaml_files()
    for path in yaml_files():
        with open(path) as f:
            assert list(yaml.safe_load_all(f)), path


def test_objects_have_api_version_kind_and_name():
    objects = k8s_objects()
    assert {doc["kind"] for _, doc in objects} >= {
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet",
        "Service", "ServiceMonitor"}
    for path, doc in objects:
        assert doc.get("apiVersion") and doc.get("kind"), path
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", doc["metadata"]["name"]), path
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"].get("namespace") == "tracehound", path


def test_kustomizations_list_existing_resources_and_every_manifest():
    listed = set()
    for path in glob.glob(os.path.join(K8S, "**", "kustomization.yaml"), recursive=True):
        with open(path) as f:
            doc = yaml.safe_load(f)
        assert doc["kind"] == "Kustomization"
        for resource in doc["resources"]:
            target = os.path.normpath(os.path.join(os.path.dirname(path), resource))
            if os.path.isdir(target):
                assert os.path.exists(os.path.join(target, "kustomization.yaml")), target
            else:
                assert os.path.isfile(target), target
                listed.add(target)
    assert {p for p, _ in k8s_objects()} == listed


# What `kubectl apply -k` builds, for the kustomize features these
# kustomizations use: no kubectl, kustomize or API server runs here, so the
# build is modelled, and a kustomization using a feature the model lacks fails
# below instead of being half understood.
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "namespace", "resources", "images"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PriorityClass", "StorageClass", "PersistentVolume"}
POD_TEMPLATE_KINDS = {"DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job"}


def split_image(image):
    """(name, tag) of an image reference: a registry's :port is no tag."""
    name, sep, tag = image.rpartition(":")
    return (name, tag) if sep and "/" not in tag else (image, "")


def kustomize(directory):
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        doc = yaml.safe_load(f)
    assert doc["apiVersion"] == "kustomize.config.k8s.io/v1beta1", directory
    assert doc["kind"] == "Kustomization", directory
    assert set(doc) <= KUSTOMIZATION_FIELDS, \
        f"{directory}: {sorted(set(doc) - KUSTOMIZATION_FIELDS)} not modelled here"
    objects = []
    for resource in doc["resources"]:
        target = os.path.normpath(os.path.join(directory, resource))
        if os.path.isdir(target):
            objects += kustomize(target)
        else:
            with open(target) as f:
                objects += [obj for obj in yaml.safe_load_all(f) if obj]
    if "namespace" in doc:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = doc["namespace"]
            for subject in obj.get("subjects", []):
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = doc["namespace"]
    for image in doc.get("images", []):
        assert set(image) <= {"name", "newName", "newTag"}, image
        for obj in objects:
            if obj["kind"] not in POD_TEMPLATE_KINDS:
                continue
            pod = obj["spec"]["template"]["spec"]
            for container in pod.get("initContainers", []) + pod["containers"]:
                name, tag = split_image(container["image"])
                if name == image["name"]:
                    tag = image.get("newTag", tag)
                    container["image"] = image.get("newName", name) + (":" + tag if tag else "")
    # kustomize refuses two resources with one id
    ids = [(obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else "", obj["kind"],
            obj["metadata"].get("namespace", ""), obj["metadata"]["name"]) for obj in objects]
    assert len(set(ids)) == len(ids), f"{directory}: an object twice: {sorted(ids)}"
    return objects


@pytest.mark.parametrize("overlay", ["base", "prometheus-operator"])
def test_kustomize_builds(overlay):
    docs = kustomize(os.path.join(K8S, overlay))
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    # the images entry names the container's image, so the build points it at a registry
    assert image.count(":") == 1 and image.split(":")[0] != "tracehound", image
    assert ("ServiceMonitor" in {d["kind"] for d in docs}) == (overlay == "prometheus-operator")
    for doc in docs:
        namespace = doc["metadata"].get("namespace")
        assert namespace == (None if doc["kind"] in CLUSTER_SCOPED else "tracehound"), doc


# the oldest Kubernetes the manifests promise to fit, and the newest the
# schemas know: both validate strictly (no field the API would not know)
KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
# kinds the API server schemas cannot know: a CRD's, checked by the tests above
CUSTOM_KINDS = {"ServiceMonitor"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", ["base", "prometheus-operator"])
def test_built_objects_validate_against_the_api_schemas(overlay, version):
    checked = 0
    for doc in kustomize(os.path.join(K8S, overlay)):
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} against {version}: "
                        f"{exc.message} at {'.'.join(map(str, exc.path))}")
        checked += 1
    assert checked >= 5


def test_daemonset_selector_matches_template_labels(daemonset):
    selector = daemonset["spec"]["selector"]["matchLabels"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert selector and selector.items() <= labels.items()


def test_pod_runs_privileged_in_the_host_namespaces(pod, container):
    assert set(pod) <= POD_SPEC_FIELDS
    assert set(container) <= CONTAINER_FIELDS
    assert pod["hostPID"] is True and pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert container["image"]
    assert container["securityContext"]["privileged"] is True
    assert {"operator": "Exists"} in pod["tolerations"]


def test_volume_mounts_refer_to_host_paths_the_agent_needs(pod, container):
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted = {}
    for mount in container["volumeMounts"]:
        assert set(mount) <= MOUNT_FIELDS, mount
        assert mount["name"] in volumes, f"volumeMount {mount['name']} has no volume"
        mounted[mount["name"]] = mount
    assert set(volumes) == set(mounted), "volumes nobody mounts"
    by_host_path = {}
    for name, volume in volumes.items():
        if "hostPath" in volume:
            assert volume["hostPath"].get("type", "") in HOST_PATH_TYPES
            by_host_path[volume["hostPath"]["path"]] = mounted[name]
    assert set(by_host_path) == set(HOST_MOUNTS)
    for host_path, read_only in HOST_MOUNTS.items():
        mount = by_host_path[host_path]
        # same path inside: the agent and /var/log/containers' symlinks use host paths
        assert mount["mountPath"] == host_path
        assert mount.get("readOnly", False) == read_only, host_path


def run_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, sub.choices["run"]


def expand_env(arg, env):
    """The kubelet's $(VAR) expansion; a reference it cannot resolve stays verbatim."""
    def sub(m):
        assert m.group(1) in env, f"{arg}: $({m.group(1)}) is not defined in env"
        return env[m.group(1)]
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, arg)


def test_args_are_flags_of_tracehound_run(container):
    parser, run = run_parser()
    flags = {opt for action in run._actions for opt in action.option_strings}
    assert container["command"] == ["tracehound"]
    args = container["args"]
    assert args[0] == "run"
    for arg in args[1:]:
        # exact names: argparse would also accept an abbreviation
        assert arg.split("=", 1)[0] in flags, f"tracehound run has no flag {arg}"
    env = {e["name"]: "192.0.2.10" for e in container["env"] if "valueFrom" in e}
    parsed = parser.parse_args([expand_env(a, env) for a in args])
    assert parsed.command == "run"
    assert parsed.listen == "0.0.0.0:9560"
    assert parsed.pod_logs_dir == "/var/log/pods"
    assert parsed.kubelet_url == "https://192.0.2.10:10250/pods"
    node_ip = next(e for e in container["env"] if e["name"] == "NODE_IP")
    assert node_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"


def test_ports_agree_across_agent_service_and_service_monitor(daemonset, container):
    _, port = parse_listen(next(a.split("=", 1)[1] for a in container["args"]
                                if a.startswith("--listen=")))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": port}
    # every HTTP path needs credentials the kubelet lacks: the probes connect
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[kind]
        assert set(probe) <= PROBE_FIELDS, kind
        assert ports.get(probe["tcpSocket"]["port"], probe["tcpSocket"]["port"]) == port, kind
    template = daemonset["spec"]["template"]
    service = one("Service")
    for annotations in (template["metadata"]["annotations"], service["metadata"]["annotations"]):
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port)
        assert annotations["prometheus.io/path"] == "/metrics"
        assert annotations["prometheus.io/scheme"] == "https"
    assert service["spec"]["clusterIP"] == "None"   # one endpoint per node
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (svc_port,) = service["spec"]["ports"]
    assert svc_port["port"] == port
    assert ports.get(svc_port["targetPort"], svc_port["targetPort"]) == port
    monitor = one("ServiceMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["metadata"]["namespace"] in monitor["namespaceSelector"]["matchNames"]
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] == svc_port["name"] and endpoint["path"] == "/metrics"
    relabels = endpoint["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
            "action": "replace"} in relabels
    # the workload's namespace/pod/container labels must not become exported_*
    dropped = [r["regex"] for r in relabels if r.get("action") == "labeldrop"]
    assert dropped and all(re.fullmatch(dropped[0], label)
                           for label in ("namespace", "pod", "container"))


def test_rbac_binds_the_daemonset_service_account_to_kubelet_pods_only(pod):
    account = one("ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    role, binding = one("ClusterRole"), one("ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert {"kind": "ServiceAccount", "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"]} in binding["subjects"]
    # the kubelet authorizes GET /pods as get on nodes/proxy (nodes/pods where
    # fine-grained kubelet authorization is on); nothing else is needed
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/pods", "nodes/proxy"],
                              "verbs": ["get"]}]


def test_namespace_admits_privileged_pods():
    labels = one("Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
