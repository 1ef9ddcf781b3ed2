#!/usr/bin/env python3
"""//deploy:manifests_test: the Kubernetes manifests render, validate and
follow the deployment policy; and the checks catch each kind of mistake.

For every overlay in deploy/k8s/overlays/ (cpu, autoscaling, gpu, local):
  * `kubectl kustomize` renders it;
  * every object validates, strictly (no unknown fields), against the
    schemas of the newest Kubernetes release kubernetes-validate ships
    (1.37 with the pinned 1.37.0); custom resources (ServiceMonitor) are
    allowed only by name and checked for their essential fields;
  * the policy holds for every pod template:
      - startup, readiness and liveness probes; the gRPC servers' are
        native grpc probes, readiness on service "" and liveness on
        "pdserve.liveness" (rpc/health_service.h: readiness goes
        NOT_SERVING on drain, liveness does not);
      - cpu and memory requests and limits;
      - non-root (runAsNonRoot, a non-zero uid), a read-only root
        filesystem with a writable /tmp volume, no privilege escalation,
        every capability dropped;
      - terminationGracePeriodSeconds >= the drain timeout + 10 s: the
        worker's --drain_timeout_ms (default 30 s) or the router's
        --shutdown_grace_ms, read from the args and the ConfigMap flag
        files the args name (--flagfile), which must exist;
      - rolling updates with maxUnavailable 0, a topology spread, and
        prometheus.io scrape annotations;
      - a PodDisruptionBudget selecting each Deployment's pods;
      - NetworkPolicies: some select every pod, and those open to other
        than pdserve's own pods open only the client and metrics ports;
    and for the cluster overlays (all but local): a NetworkPolicy selects
    every pod, a headless router Service publishes not-ready addresses,
    and a ServiceMonitor exists; for local: host network and an image that
    is never pulled.
Then the same checks run on copies of the manifests broken on purpose (a
probe removed, a limit removed, root allowed, a writable root, a grace
period below the drain timeout, a PDB removed, an unknown field, a missing
flag file, maxUnavailable 1, a control port or
the internal policy opened to everyone) and each must be reported.

Run by deploy/manifests_test.sh with $PDSERVE_PYTHON (the venv of
scripts/python_env.sh, which has kubernetes-validate).
"""

import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml
import kubernetes_validate
import kubernetes_validate.utils as kv_utils

K8S_VERSION = kv_utils.latest_version()
OVERLAYS = ["cpu", "autoscaling", "gpu", "local"]
# Custom resources the manifests may use; the Kubernetes schemas lack them.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"),
                ("keda.sh/v1alpha1", "ScaledObject")}
GRPC_SERVERS = {"pd-router", "pd-prefill-worker", "pd-decode-worker"}
DEFAULT_DRAIN_MS = {"pd-prefill-worker": 30000, "pd-decode-worker": 30000,
                    "pd-router": 5000, "pd-planner": 0}
GRACE_MARGIN_S = 10
# Ports anyone may reach: the router's client gRPC and HTTP, and metrics.
# Control (membership, admin) and worker ports take pdserve's pods only.
OPEN_PORTS = {50050, 8000, 9090}
POD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


def render(k8s_dir, overlay):
    out = subprocess.run(
        ["kubectl", "kustomize", os.path.join(k8s_dir, "overlays", overlay)],
        capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError("kubectl kustomize %s failed: %s" %
                           (overlay, out.stderr.strip()))
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def name_of(obj):
    return "%s/%s" % (obj["kind"], obj["metadata"]["name"])


def selects(selector, labels):
    match = (selector or {}).get("matchLabels", {})
    if not match and not (selector or {}).get("matchExpressions"):
        return True  # {} selects every pod
    return all(labels.get(k) == v for k, v in match.items())


def flag_values(args, configmaps, pod_spec, container, flag):
    """The values of --flag in args and in the --flagfile files they name
    (ConfigMap keys at their mount path), in order; errors for a missing
    flag file."""
    values, errors = [], []
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    lines = []
    for arg in args:
        if arg.startswith("--flagfile="):
            for path in arg.split("=", 1)[1].split(","):
                folder, key = os.path.dirname(path), os.path.basename(path)
                volume = volumes.get(mounts.get(folder, ""), {})
                cm_name = volume.get("configMap", {}).get("name")
                data = configmaps.get(cm_name, {}).get("data", {})
                if key not in data:
                    errors.append("flag file %s is not in a mounted ConfigMap" % path)
                    continue
                lines += data[key].split()
        else:
            lines.append(arg)
    for line in lines:
        m = re.match(r"--%s=(.*)$" % flag, line)
        if m:
            values.append(m.group(1))
    return values, errors


def check_objects(overlay, objs):
    """Every policy failure of one rendered overlay, as strings."""
    failures = []
    fail = failures.append
    configmaps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    netpols = [o for o in objs if o["kind"] == "NetworkPolicy"]

    for obj in objs:
        key = (obj.get("apiVersion"), obj.get("kind"))
        if key in CUSTOM_KINDS:
            if obj["kind"] == "ServiceMonitor" and not (
                    obj.get("spec", {}).get("selector") and
                    obj["spec"].get("endpoints")):
                fail("%s: %s lacks selector or endpoints" % (overlay, name_of(obj)))
            continue
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.utils.SchemaNotFoundError:
            fail("%s: %s: no Kubernetes %s schema for %s" %
                 (overlay, name_of(obj), K8S_VERSION, key))
        except kubernetes_validate.utils.ValidationError as e:
            fail("%s: %s does not validate against Kubernetes %s: %s" %
                 (overlay, name_of(obj), K8S_VERSION, str(e).splitlines()[0]))

    for obj in objs:
        if obj["kind"] not in POD_KINDS:
            continue
        where = "%s: %s" % (overlay, name_of(obj))
        template = obj["spec"]["template"]
        spec = template["spec"]
        labels = template["metadata"].get("labels", {})
        pod_sc = spec.get("securityContext", {})
        annotations = template["metadata"].get("annotations", {})

        if obj["kind"] == "Deployment":
            ru = obj["spec"].get("strategy", {}).get("rollingUpdate", {})
            if str(ru.get("maxUnavailable", "25%")) not in ("0", "0%"):
                fail("%s: rolling update maxUnavailable is not 0" % where)
        if not spec.get("topologySpreadConstraints") and overlay != "local":
            fail("%s: no topologySpreadConstraints" % where)
        if annotations.get("prometheus.io/scrape") != "true" or \
                not annotations.get("prometheus.io/port"):
            fail("%s: no prometheus.io scrape annotations" % where)
        if not any(selects(p["spec"].get("selector"), labels) for p in pdbs):
            fail("%s: no PodDisruptionBudget selects its pods" % where)
        if overlay == "local":
            if not spec.get("hostNetwork"):
                fail("%s: local pods use the host network" % where)
        else:
            mine = [n for n in netpols if selects(n["spec"].get("podSelector"), labels)]
            if not mine:
                fail("%s: no NetworkPolicy selects its pods" % where)
            for n in mine:
                for rule in n["spec"].get("ingress", []):
                    peers = rule.get("from", [])
                    only_pdserve = peers and all(
                        p.get("podSelector", {}).get("matchLabels", {}).get(
                            "app.kubernetes.io/part-of") == "pdserve" and
                        "namespaceSelector" not in p for p in peers)
                    ports = {p.get("port") for p in rule.get("ports", [])}
                    if not only_pdserve and (not ports or not ports <= OPEN_PORTS):
                        fail("%s: %s opens ports %s to other than pdserve's pods" %
                             (where, name_of(n), sorted(ports) or "all"))

        tmp_volumes = set()
        for c in spec["containers"]:
            cwhere = "%s container %s" % (where, c["name"])
            command = (c.get("command") or [""])[0]
            sc = c.get("securityContext", {})
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe not in c:
                    fail("%s: no %s" % (cwhere, probe))
            if command in GRPC_SERVERS:
                ready = c.get("readinessProbe", {}).get("grpc")
                live = c.get("livenessProbe", {}).get("grpc")
                start = c.get("startupProbe", {}).get("grpc")
                if ready is None or ready.get("service", "") != "":
                    fail("%s: readiness is not a grpc probe on service \"\"" % cwhere)
                if live is None or live.get("service") != "pdserve.liveness":
                    fail("%s: liveness is not a grpc probe on pdserve.liveness" % cwhere)
                if start is None:
                    fail("%s: startup is not a grpc probe" % cwhere)
            resources = c.get("resources", {})
            for kind in ("requests", "limits"):
                for res in ("cpu", "memory"):
                    if res not in resources.get(kind, {}):
                        fail("%s: no %s %s" % (cwhere, res, kind[:-1]))
            non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
            uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
            if non_root is not True or uid in (None, 0):
                fail("%s: may run as root (runAsNonRoot %s, runAsUser %s)" %
                     (cwhere, non_root, uid))
            if sc.get("readOnlyRootFilesystem") is not True:
                fail("%s: root filesystem is writable" % cwhere)
            if sc.get("allowPrivilegeEscalation") is not False:
                fail("%s: privilege escalation allowed" % cwhere)
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                fail("%s: capabilities not all dropped" % cwhere)
            if overlay == "local" and c.get("imagePullPolicy") != "Never":
                fail("%s: the local image is pulled" % cwhere)
            tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            if not tmp:
                fail("%s: no writable /tmp volume" % cwhere)
            tmp_volumes.update(m["name"] for m in tmp)

            flag = "shutdown_grace_ms" if command == "pd-router" else "drain_timeout_ms"
            values, errors = flag_values(c.get("args", []), configmaps, spec, c, flag)
            for e in errors:
                fail("%s: %s" % (cwhere, e))
            drain_ms = int(values[-1]) if values else DEFAULT_DRAIN_MS.get(command, 30000)
            grace = spec.get("terminationGracePeriodSeconds", 30)
            if grace < drain_ms / 1000 + GRACE_MARGIN_S:
                fail("%s: terminationGracePeriodSeconds %s is not longer than its "
                     "drain (--%s=%d ms) + %d s" %
                     (cwhere, grace, flag, drain_ms, GRACE_MARGIN_S))
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for name in tmp_volumes:
            if "emptyDir" not in volumes.get(name, {}):
                fail("%s: /tmp volume %s is not an emptyDir" % (where, name))

    if overlay != "local":
        routers = [o for o in objs if o["kind"] == "Service" and
                   o["spec"].get("clusterIP") == "None" and
                   o["spec"].get("selector", {}).get("app.kubernetes.io/component") == "router"]
        if not any(s["spec"].get("publishNotReadyAddresses") for s in routers):
            fail("%s: no headless router Service with publishNotReadyAddresses" % overlay)
        if not any(o["kind"] == "ServiceMonitor" for o in objs):
            fail("%s: no ServiceMonitor" % overlay)
    return failures


def check_tree(k8s_dir):
    failures = []
    for overlay in OVERLAYS:
        try:
            objs = render(k8s_dir, overlay)
        except RuntimeError as e:
            failures.append(str(e))
            continue
        failures += check_objects(overlay, objs)
    return failures


class ManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="manifests_test.",
                                   dir=os.environ.get("TEST_TMPDIR"))
        cls.source = cls.copy_tree(os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "k8s"), cls.tmp, "source")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @staticmethod
    def copy_tree(source, tmp, name):
        # Dereferenced: in Bazel's runfiles every file is a link to the
        # source tree, and kustomize refuses files from outside its root.
        target = os.path.join(tmp, name)
        shutil.copytree(source, target, symlinks=False)
        return target

    def test_every_overlay_renders_validates_and_follows_the_policy(self):
        print("validating against Kubernetes %s" % K8S_VERSION)
        for overlay in OVERLAYS:
            objs = render(self.source, overlay)
            kinds = sorted(o["kind"] for o in objs)
            print("%s: %d objects (%s)" % (overlay, len(objs), ", ".join(sorted(set(kinds)))))
            self.assertEqual(check_objects(overlay, objs), [])

    def test_expected_objects(self):
        cpu = render(self.source, "cpu")
        names = {name_of(o) for o in cpu}
        for n in ["Deployment/pd-router", "Deployment/pd-prefill", "Deployment/pd-decode",
                  "Service/pd-router", "Service/pd-router-headless", "ConfigMap/pdserve-flags",
                  "Secret/pdserve-cluster-token", "PodDisruptionBudget/pd-prefill",
                  "PodDisruptionBudget/pd-decode", "PodDisruptionBudget/pd-router",
                  "NetworkPolicy/pdserve-internal", "ServiceMonitor/pdserve"]:
            self.assertIn(n, names)
        router = next(o for o in cpu if name_of(o) == "Deployment/pd-router")
        self.assertEqual(router["spec"]["replicas"], 2)
        auto = {name_of(o): o for o in render(self.source, "autoscaling")}
        self.assertIn("Deployment/pd-planner", auto)
        for pool in ("prefill", "decode"):
            hpa = auto["HorizontalPodAutoscaler/pd-%s" % pool]
            self.assertEqual(hpa["spec"]["scaleTargetRef"]["name"], "pd-%s" % pool)
            metric = hpa["spec"]["metrics"][0]["external"]["metric"]
            self.assertEqual(metric["name"], "pdserve_planner_desired_replicas")
            self.assertEqual(metric["selector"]["matchLabels"]["pool"], pool)
        gpu = render(self.source, "gpu")
        for o in gpu:
            if o["kind"] == "Deployment" and o["metadata"]["name"] in ("pd-prefill", "pd-decode"):
                container = o["spec"]["template"]["spec"]["containers"][0]
                self.assertEqual(container["resources"]["limits"].get("nvidia.com/gpu"), "1")
                env = {e["name"]: e.get("value") for e in container["env"]}
                self.assertIn("cuda_copy", env["UCX_TLS"])  # the patch hit UCX_TLS
                self.assertIn("POD_IP", env)
        local = [o for o in render(self.source, "local") if o["kind"] == "Deployment"]
        self.assertEqual(sorted(o["metadata"]["name"] for o in local),
                         ["pd-decode", "pd-decode-b", "pd-prefill", "pd-router"])
        for o in local:  # the patches by index hit the volumes meant
            volumes = {v["name"]: v for v in o["spec"]["template"]["spec"]["volumes"]}
            self.assertIn("hostPath", volumes["model"])
            # podman cannot mount a Secret: the token from a host folder.
            self.assertEqual(volumes["cluster-token"].get("hostPath", {}).get("path"),
                             "/var/lib/pdserve/secrets")
            mounts = [m["name"] for m in o["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]]
            self.assertEqual(sorted(mounts), ["cluster-token", "flags", "model", "tmp"])

    def mutate(self, name, path, old, new, count=1):
        tree = self.copy_tree(self.source, self.tmp, name)
        full = os.path.join(tree, path)
        with open(full) as f:
            text = f.read()
        self.assertIn(old, text, "%s: %r not in %s" % (name, old, path))
        with open(full, "w") as f:
            f.write(text.replace(old, new, count))
        return check_tree(tree)

    def assert_caught(self, failures, pattern):
        print("caught: %s" % (failures[:1],))
        self.assertTrue(any(re.search(pattern, f) for f in failures),
                        "expected a failure matching %r, got %s" % (pattern, failures))

    def test_broken_manifests_are_caught(self):
        cases = [
            ("no_liveness", "base/decode/deployment.yaml",
             "          livenessProbe:\n            grpc:\n              port: 50070\n"
             "              service: pdserve.liveness\n            periodSeconds: 10\n"
             "            failureThreshold: 3\n", "", r"pd-decode.*no livenessProbe"),
            ("liveness_on_readiness", "base/router/deployment.yaml",
             "              service: pdserve.liveness\n", "",
             r"pd-router.*liveness is not a grpc probe on pdserve.liveness"),
            ("no_memory_limit", "base/prefill/deployment.yaml",
             "            limits:\n              cpu: \"4\"\n              memory: 2Gi\n",
             "            limits:\n              cpu: \"4\"\n", r"pd-prefill.*no memory limit"),
            ("root", "base/router/deployment.yaml", "runAsNonRoot: true",
             "runAsNonRoot: false", r"pd-router.*may run as root"),
            ("writable_root", "base/decode/deployment.yaml",
             "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false",
             r"pd-decode.*root filesystem is writable"),
            ("short_grace", "base/decode/deployment.yaml",
             "terminationGracePeriodSeconds: 60", "terminationGracePeriodSeconds: 35",
             r"pd-decode.*terminationGracePeriodSeconds 35"),
            ("long_drain", "base/flags/prefill.flags", "--drain_timeout_ms=30000",
             "--drain_timeout_ms=55000", r"cpu: Deployment/pd-prefill.*drain_timeout_ms=55000"),
            ("no_pdb", "base/prefill/kustomization.yaml", "  - pdb.yaml\n", "",
             r"pd-prefill: no PodDisruptionBudget"),
            ("unknown_field", "base/router/deployment.yaml", "          imagePullPolicy:",
             "          imagePulPolicy:", r"pd-router does not validate"),
            ("missing_flag_file", "base/kustomization.yaml", "      - flags/decode.flags\n",
             "", r"decode.flags is not in a mounted ConfigMap"),
            ("max_unavailable", "base/router/deployment.yaml", "maxUnavailable: 0",
             "maxUnavailable: 1", r"pd-router: rolling update maxUnavailable"),
            ("control_port_open", "base/common.yaml", "        - port: 8000\n",
             "        - port: 8000\n          protocol: TCP\n        - port: 50051\n",
             r"pd-router: NetworkPolicy/pdserve-clients opens ports \[8000, 50050, 50051\]"),
            ("internal_from_anywhere", "base/common.yaml",
             "    - from:\n        - podSelector:\n",
             "    - from:\n        - namespaceSelector: {}\n        - podSelector:\n",
             r"pd-decode: NetworkPolicy/pdserve-internal opens ports all"),
        ]
        for name, path, old, new, pattern in cases:
            with self.subTest(name):
                failures = self.mutate(name, path, old, new)
                self.assert_caught(failures, pattern)


if __name__ == "__main__":
    unittest.main(verbosity=2)
