"""deploy/*.yaml, checked without a cluster: every document through the kubernetes client's model classes
(a field the API does not have, a wrong type or a missing required field is an error, as `kubectl apply`
would say), the references between documents (claims, selectors, volume mounts), and the opscope command
lines inside them against opscope's own parser."""
import contextlib
import inspect
import io
import json
from pathlib import Path

import pytest
import yaml

kubernetes = pytest.importorskip("kubernetes", reason="pip install kubernetes (a test dependency)")
from kubernetes import client as k8s  # noqa: E402

from opscope.app.cli import build_parser  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
MODELS = {("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim", ("v1", "Service"): "V1Service",
          ("apps/v1", "Deployment"): "V1Deployment", ("batch/v1", "Job"): "V1Job", ("v1", "Secret"): "V1Secret",
          ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy"}
SCALARS = {"str": str, "int": int, "bool": bool, "float": (int, float)}


class Wrong(Exception):
    pass


def check(value, type_name: str, where: str) -> None:
    """`value` (parsed YAML) has exactly the shape of the client's `type_name` ('V1PodSpec', 'list[V1Container]',
    'dict(str, str)', 'str', 'object' for IntOrString and the like): no unknown keys anywhere."""
    # the client writes list[X] / dict(str, X) in older releases, List[X] / Dict[str, X] in newer ones
    if type_name.lower().startswith("list["):
        if not isinstance(value, list):
            raise Wrong(f"{where}: expected a list, got {type(value).__name__}")
        for i, item in enumerate(value):
            check(item, type_name[5:-1], f"{where}[{i}]")
    elif type_name.startswith(("dict(", "Dict[")):
        if not isinstance(value, dict):
            raise Wrong(f"{where}: expected a mapping")
        inner = type_name[5:-1].split(", ", 1)[1]
        for k, v in value.items():
            check(v, inner, f"{where}.{k}")
    elif type_name in SCALARS:
        if isinstance(value, bool) and type_name != "bool" or not isinstance(value, SCALARS[type_name]):
            raise Wrong(f"{where}: expected {type_name}, got {type(value).__name__} {value!r}")
    elif type_name == "object":
        return
    else:
        model = getattr(k8s, type_name)
        if not isinstance(value, dict):
            raise Wrong(f"{where}: expected a {type_name} mapping, got {type(value).__name__}")
        fields = {key: attr for attr, key in model.attribute_map.items()}
        for key, v in value.items():
            if key not in fields:
                raise Wrong(f"{where}.{key}: {type_name} has no field {key!r}")
            check(v, model.openapi_types[fields[key]], f"{where}.{key}")


def load(doc: dict, where: str):
    """The document as the client's model object: strict shape (check), then the client's own deserializer,
    whose constructors refuse a missing required field."""
    kind = MODELS.get((doc.get("apiVersion"), doc.get("kind")))
    if kind is None:
        raise Wrong(f"{where}: {doc.get('apiVersion')}/{doc.get('kind')} is not a kind this test knows")
    check(doc, kind, where)

    api = k8s.ApiClient()
    try:
        if "response_text" in inspect.signature(api.deserialize).parameters:      # newer clients
            return api.deserialize(json.dumps(doc), kind, "application/json")

        class _Response:
            data = json.dumps(doc)
        return api.deserialize(_Response(), kind)
    except ValueError as e:
        raise Wrong(f"{where}: {e}")


def documents():
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc:
                docs.append((f"{path.name}[{i}] {doc.get('kind')}", doc))
    return docs


def test_there_are_manifests_for_the_analyzer_and_a_training_job():
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in documents()}
    assert {("Deployment", "opscope"), ("Service", "opscope"), ("PersistentVolumeClaim", "opscope-data"),
            ("Job", "opscope-train"), ("Service", "opscope-train")} <= kinds


@pytest.mark.parametrize("where, doc", documents(), ids=[w for w, _ in documents()])
def test_each_manifest_loads_as_the_kubernetes_api_model(where, doc):
    assert load(doc, where) is not None


def test_a_wrong_field_or_a_missing_required_one_is_caught():
    docs = dict(documents())
    deployment = next(d for w, d in docs.items() if d["kind"] == "Deployment")
    typo = json.loads(json.dumps(deployment))
    typo["spec"]["template"]["spec"]["contianers"] = typo["spec"]["template"]["spec"].pop("containers")
    with pytest.raises(Wrong, match=r"spec\.template\.spec\.contianers: V1PodSpec has no field 'contianers'"):
        load(typo, "typo")
    wrong_type = json.loads(json.dumps(deployment))
    wrong_type["spec"]["replicas"] = "one"
    with pytest.raises(Wrong, match=r"spec\.replicas: expected int"):
        load(wrong_type, "wrong type")
    nameless = json.loads(json.dumps(deployment))
    del nameless["spec"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(Wrong, match="name"):
        load(nameless, "no name")


def _pods():
    for where, doc in documents():
        if doc["kind"] in ("Deployment", "Job"):
            yield where, doc, doc["spec"]["template"]


def test_references_between_documents_hold():
    docs = [d for _, d in documents()]
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    pod_labels = [t["metadata"]["labels"] | ({"job-name": d["metadata"]["name"]} if d["kind"] == "Job" else {})
                  for _, d, t in _pods()]
    for where, doc, template in _pods():
        spec = template["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for v in volumes.values():
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, where
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{where}: mount {m['name']} has no volume"
            assert any(m["mountPath"] == "/data" for m in c.get("volumeMounts", [])), f"{where}: the run store"
        if doc["kind"] == "Deployment":
            assert doc["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    for svc in (d for d in docs if d["kind"] == "Service"):
        assert any(svc["spec"]["selector"].items() <= labels.items() for labels in pod_labels), svc["metadata"]


def _opscope_argv(container: dict) -> list[str]:
    line = container.get("command", []) + container.get("args", [])
    return line[line.index("opscope") + 1:]


def _parses(argv: list[str]) -> str:
    """'' when opscope's parser takes argv, else its one-line error."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser(argv).parse_args(argv)
    except SystemExit as e:
        return err.getvalue().strip() or f"exit {e.code}"
    return ""


def test_the_opscope_command_lines_in_the_manifests_parse():
    for where, doc, template in _pods():
        for c in template["spec"]["containers"]:
            argv = _opscope_argv(c)
            assert _parses(argv) == "", (where, argv)
            for probe in ("readinessProbe", "livenessProbe"):
                if probe in c:
                    assert c[probe]["exec"]["command"] == ["python", "-m", "opscope.app.web.health"]


# --- Pod Security "restricted" and a policy scanner's high-severity checks ---------------------------------------
# The restricted profile (kubernetes.io/docs/concepts/security/pod-security-standards), field by field, read from
# the client's model objects so a misspelt field cannot pass by being ignored.
RESTRICTED_VOLUMES = {"config_map", "csi", "downward_api", "empty_dir", "ephemeral", "persistent_volume_claim",
                      "projected", "secret"}


def restricted_violations(pod_spec) -> list[str]:
    """What the Pod Security 'restricted' profile (and the scanner checks we hold to) refuses in a V1PodSpec."""
    out = []
    psc = pod_spec.security_context
    if pod_spec.host_network or pod_spec.host_pid or pod_spec.host_ipc:
        out.append("host namespaces")
    if pod_spec.automount_service_account_token is not False:
        out.append("service-account token automounted")
    for v in pod_spec.volumes or []:
        kinds = {k for k in v.attribute_map if k != "name" and getattr(v, k) is not None}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v.name}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    for c in (pod_spec.containers or []) + (pod_spec.init_containers or []):
        sc = c.security_context
        where = f"container {c.name}"
        if sc is None:
            out.append(f"{where}: no securityContext")
            continue
        if sc.privileged:
            out.append(f"{where}: privileged")
        if sc.allow_privilege_escalation is not False:
            out.append(f"{where}: allowPrivilegeEscalation is not false")
        if not (sc.capabilities and sc.capabilities.drop and "ALL" in sc.capabilities.drop):
            out.append(f"{where}: capabilities not dropped (ALL)")
        if sc.capabilities and set(sc.capabilities.add or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{where}: adds capabilities")
        non_root = sc.run_as_non_root if sc.run_as_non_root is not None else (psc and psc.run_as_non_root)
        if non_root is not True:
            out.append(f"{where}: runAsNonRoot")
        uid = sc.run_as_user if sc.run_as_user is not None else (psc and psc.run_as_user)
        if uid == 0:
            out.append(f"{where}: runs as uid 0")
        seccomp = sc.seccomp_profile or (psc and psc.seccomp_profile)
        if seccomp is None or seccomp.type not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile is not RuntimeDefault or Localhost")
        if sc.read_only_root_filesystem is not True:
            out.append(f"{where}: root filesystem writable")
        image = c.image or ""
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        if "@sha256:" not in image and tag in ("", "latest"):
            out.append(f"{where}: image {image!r} has no fixed tag")
        limits = (c.resources and c.resources.limits) or {}
        if "memory" not in limits or "cpu" not in limits:
            out.append(f"{where}: no cpu and memory limits")
    return out


def test_the_pods_pass_the_restricted_profile_and_the_scanners_high_severity_checks():
    found = {where: restricted_violations(load(doc, where).spec.template.spec) for where, doc, _ in _pods()}
    assert found and all(v == [] for v in found.values()), found


def test_the_restricted_check_catches_what_the_profile_refuses():
    """Each rule on its own: the checker above is no test unless it fails on the manifests it should refuse."""
    where, doc, _ = next(_pods())
    breaks = {
        "service-account token": lambda s, c: s.pop("automountServiceAccountToken"),
        "seccompProfile": lambda s, c: (s["securityContext"].pop("seccompProfile"), c["securityContext"].pop("seccompProfile")),
        "allowPrivilegeEscalation": lambda s, c: c["securityContext"].update(allowPrivilegeEscalation=True),
        "capabilities": lambda s, c: c["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}),
        "root filesystem": lambda s, c: c["securityContext"].pop("readOnlyRootFilesystem"),
        "fixed tag": lambda s, c: c.update(image="localhost/opscope:latest"),
        "limits": lambda s, c: c["resources"]["limits"].pop("cpu"),
        "volume": lambda s, c: s["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
        "uid 0": lambda s, c: c["securityContext"].update(runAsUser=0),
    }
    for what, spoil in breaks.items():
        bad = json.loads(json.dumps(doc))
        spec = bad["spec"]["template"]["spec"]
        spoil(spec, spec["containers"][0])
        assert any(what in v for v in restricted_violations(load(bad, what).spec.template.spec)), what


def test_every_pod_is_covered_by_a_network_policy():
    docs = [d for _, d in documents()]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for where, doc, template in _pods():
        labels = template["metadata"]["labels"] | ({"job-name": doc["metadata"]["name"]} if doc["kind"] == "Job" else {})
        covering = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert covering, f"{where}: no NetworkPolicy selects its pods"
        assert all(set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"} for p in covering), where


def test_the_training_job_is_elastic_with_checkpoints_on_the_shared_volume():
    job = next(d for _, d in documents() if d["kind"] == "Job")
    c = job["spec"]["template"]["spec"]["containers"][0]
    argv = _opscope_argv(c)
    assert "--elastic" in argv and "--checkpoint-dir" in argv
    ck = argv[argv.index("--checkpoint-dir") + 1]
    assert any(ck.startswith(m["mountPath"]) for m in c["volumeMounts"] if m["name"] == "shared"), ck
    launcher = c["command"][:c["command"].index("opscope")]
    assert any(a.startswith("--rdzv-endpoint=") for a in launcher) and any(a.startswith("--nnodes=") for a in launcher)
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    assert env.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1"      # README: a re-join after a shrink needs it
