#!/usr/bin/env python3
"""Check deploy/: the Kubernetes manifests and the Containerfile say what the operations docs
promise (probes on /healthz, non-root, the config from the ConfigMap, the socket in a shared
host directory, multi-stage CUDA build, the client library and headers installed into the image,
OCI labels, a HEALTHCHECK kept by `podman build --format docker`), and every attnd config they
carry is one the daemon accepts (`attnd --config FILE --check-config`, when --attnd is given).
No container engine runs here: the Containerfile is read, build-image.sh runs against a
stand-in engine.

usage: check_manifests.py [--attnd BINARY] [DEPLOY_DIR]
Exit 0 when every check passes, 1 otherwise, 77 (skipped) when PyYAML is missing.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is not installed (scripts/setup.sh installs python3-yaml)")
    sys.exit(77)

FAILURES = []


def check(cond, what):
    if cond:
        print("ok:", what)
    else:
        print("FAIL:", what)
        FAILURES.append(what)
    return cond


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def daemon_accepts(attnd, name, text):
    """Run the daemon's config check on one config document."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        r = subprocess.run([attnd, "--config", path, "--check-config"], capture_output=True, text=True,
                           timeout=30)
        check(r.returncode == 0, f"the daemon accepts {name}" +
              ("" if r.returncode == 0 else f": {(r.stdout + r.stderr).strip()}"))
    finally:
        os.unlink(path)


def check_configmap(deploy, attnd):
    docs = load(os.path.join(deploy, "k8s", "configmap.yaml"))
    check(len(docs) == 1 and docs[0]["kind"] == "ConfigMap", "configmap.yaml is one ConfigMap")
    cm = docs[0]
    configs = {}
    for key, text in cm.get("data", {}).items():
        try:
            configs[key] = json.loads(text)
            check(True, f"ConfigMap {key} is JSON")
        except json.JSONDecodeError as e:
            check(False, f"ConfigMap {key} is JSON ({e})")
            continue
        if attnd:
            daemon_accepts(attnd, f"ConfigMap {key}", text)
    return cm["metadata"]["name"], configs


def probe_ok(c, kind, port_names):
    p = c.get(kind) or {}
    g = p.get("httpGet") or {}
    return g.get("path") == "/healthz" and g.get("port") in port_names


def check_container(c, configs):
    name = c["name"]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    for kind in ("readinessProbe", "livenessProbe"):
        check(probe_ok(c, kind, set(ports) | set(ports.values())),
              f"{name}: {kind} is GET /healthz on a declared port")
    sc = c.get("securityContext", {})
    check(sc.get("allowPrivilegeEscalation") is False, f"{name}: no privilege escalation")
    check(sc.get("readOnlyRootFilesystem") is True, f"{name}: read-only root filesystem")
    check("ALL" in sc.get("capabilities", {}).get("drop", []), f"{name}: drops all capabilities")
    args = c.get("args", [])
    cfg = args[args.index("--config") + 1] if "--config" in args else None
    key = os.path.basename(cfg) if cfg else None
    check(cfg is not None and cfg.startswith("/etc/attnd/") and key in configs,
          f"{name}: --config {cfg} is a file of the ConfigMap")
    if key in configs:
        conf = configs[key]
        listen = conf.get("server", {}).get("listen", "")
        check(listen.startswith("ipc:///run/attnd/"), f"{name}: listens in /run/attnd ({listen})")
        http = conf.get("http", {}).get("listen", "")
        m = re.match(r"http://0\.0\.0\.0:(\d+)$", http)
        check(m is not None and int(m.group(1)) in ports.values(),
              f"{name}: the config's http.listen ({http}) is the probed container port")
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    return mounts


def check_daemonset(deploy, cm_name, configs):
    docs = load(os.path.join(deploy, "k8s", "daemonset.yaml"))
    check(len(docs) == 1 and docs[0]["kind"] == "DaemonSet", "daemonset.yaml is one DaemonSet")
    ds = docs[0]
    check(ds["apiVersion"] == "apps/v1", "DaemonSet is apps/v1")
    spec = ds["spec"]
    tmpl = spec["template"]
    labels = tmpl["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()),
          "the selector matches the pod template's labels")
    pod = tmpl["spec"]
    psc = pod.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0,
          "the pod runs as a non-root user")
    check(pod.get("hostIPC") is True, "hostIPC: engines' shared memory and CUDA IPC reach it")
    vols = {v["name"]: v for v in pod["volumes"]}
    cfg_vols = [n for n, v in vols.items() if v.get("configMap", {}).get("name") == cm_name]
    check(len(cfg_vols) == 1, f"the config volume is ConfigMap {cm_name}")
    run_vols = [n for n, v in vols.items() if v.get("hostPath", {}).get("path") == "/run/attnd"]
    check(len(run_vols) == 1, "the socket directory is the host's /run/attnd")
    for c in pod["containers"]:
        check("nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}),
              f"{c['name']}: requests no nvidia.com/gpu (engines hold the GPUs)")
        mounts = check_container(c, configs)
        check(cfg_vols and mounts.get(cfg_vols[0], {}).get("mountPath") == "/etc/attnd"
              and mounts[cfg_vols[0]].get("readOnly") is True,
              f"{c['name']}: the config is mounted read-only at /etc/attnd")
        check(run_vols and mounts.get(run_vols[0], {}).get("mountPath") == "/run/attnd",
              f"{c['name']}: the socket directory is mounted at /run/attnd")


def check_engine_example(deploy):
    docs = load(os.path.join(deploy, "k8s", "engine-example.yaml"))
    pod = docs[0]["spec"]
    check(10001 in pod.get("securityContext", {}).get("supplementalGroups", []),
          "the engine example joins group 10001 (the socket's group)")
    check(pod.get("hostIPC") is True, "the engine example shares the host IPC namespace")
    vols = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/run/attnd"]
    check(len(vols) == 1, "the engine example mounts the host's /run/attnd")


MPS_DIR = "/run/nvidia-mps"


def mps_joined(pod, containers, who):
    """A pod joins the node's MPS: hostIPC, the host's pipe directory mounted where every
    container's CUDA_MPS_PIPE_DIRECTORY points, user 10001 (the MPS server is per user)."""
    vols = [v["name"] for v in pod.get("volumes", []) if v.get("hostPath", {}).get("path") == MPS_DIR]
    check(len(vols) == 1, f"{who}: mounts the host's {MPS_DIR}")
    check(pod.get("hostIPC") is True, f"{who}: hostIPC (MPS talks through shared memory)")
    check(pod.get("securityContext", {}).get("runAsUser") == 10001,
          f"{who}: runs as user 10001, as every MPS client of the node")
    for c in containers:
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        check(vols and mounts.get(vols[0]) == MPS_DIR and env.get("CUDA_MPS_PIPE_DIRECTORY") == MPS_DIR,
              f"{who}/{c['name']}: CUDA_MPS_PIPE_DIRECTORY is the mounted {MPS_DIR}")


def check_mps(deploy):
    docs = load(os.path.join(deploy, "k8s", "mps-daemonset.yaml"))
    check(len(docs) == 1 and docs[0]["kind"] == "DaemonSet", "mps-daemonset.yaml is one DaemonSet")
    pod = docs[0]["spec"]["template"]["spec"]
    ctl = [c for c in pod["containers"] if c.get("command", [])[:2] == ["nvidia-cuda-mps-control", "-f"]]
    check(len(ctl) == 1, "the MPS DaemonSet runs nvidia-cuda-mps-control -f")
    mps_joined(pod, ctl, "nvidia-mps")
    attnd = load(os.path.join(deploy, "k8s", "daemonset.yaml"))[0]["spec"]["template"]["spec"]
    mps_joined(attnd, attnd["containers"], "attnd")
    engine = load(os.path.join(deploy, "k8s", "engine-example.yaml"))[0]["spec"]
    mps_joined(engine, engine["containers"], "engine example")
    kust = load(os.path.join(deploy, "k8s", "kustomization.yaml"))[0]
    res = kust.get("resources", [])
    check("mps-daemonset.yaml" in res and res.index("mps-daemonset.yaml") < res.index("daemonset.yaml"),
          "the kustomization applies the MPS DaemonSet, before attnd's")


def check_containerfile(deploy, attnd):
    with open(os.path.join(deploy, "Containerfile")) as f:
        text = f.read()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    check(len(froms) == 2 and "-devel-" in froms[0] and "-runtime-" in froms[1],
          f"Containerfile: builds on the CUDA devel image, runs on the runtime one ({froms})")
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    check(users and not users[-1].startswith(("0", "root")), f"Containerfile: runs as {users}")
    check(re.search(r"^COPY --from=build ", text, re.M) is not None,
          "Containerfile: the runtime stage copies only the build stage's output")
    check(re.search(r'^ENTRYPOINT \["/usr/bin/attnd"\]', text, re.M) is not None,
          "Containerfile: the entrypoint is the daemon")
    check(re.search(r"^VOLUME \[\"/run/attnd\"\]", text, re.M) is not None,
          "Containerfile: the socket directory is a volume")
    check(re.search(r"^RUN deploy/build-release.sh /src /build /out /meta ", text, re.M) is not None,
          "Containerfile: builds with deploy/build-release.sh (what deploy_release_build runs)")
    check_image_contents(deploy, text)
    check_labels(deploy, text)
    conf_path = os.path.join(deploy, "attnd.container.json")
    with open(os.path.join(deploy, "build-release.sh")) as f:
        check('"$src/deploy/attnd.container.json" "$out/etc/attnd/attnd.json"' in f.read(),
              "build-release.sh installs deploy/attnd.container.json as the image's config")
    with open(conf_path) as f:
        conf_text = f.read()
    conf = json.loads(conf_text)
    check(conf.get("server", {}).get("listen") == "ipc:///run/attnd/attnd.sock",
          "the container's default config listens in the volume")
    if attnd:
        daemon_accepts(attnd, "deploy/attnd.container.json", conf_text)


OCI_LABELS = ("title", "description", "version", "revision", "created", "source", "licenses")


def project_version(deploy):
    with open(os.path.join(deploy, "..", "CMakeLists.txt")) as f:
        m = re.search(r"^project\(attnd VERSION ([0-9.]+)", f.read(), re.M)
    return m.group(1) if m else None


def check_image_contents(deploy, text):
    """The image carries what `cmake --install` installs: the client library and headers too."""
    with open(os.path.join(deploy, "build-release.sh")) as f:
        release = f.read()
    check('DESTDIR="$out" cmake --install "$build"' in release
          and "-DCMAKE_INSTALL_PREFIX=/usr" in release,
          "build-release.sh: cmake --install (prefix /usr) into the image's files")
    check(all(t in release for t in ("attnd-client", "attnd_client_static", "usr/include/attnd/client.h",
                                     "pkgconfig/attnd-client.pc", "cmake/attnd/attnd-config.cmake")),
          "build-release.sh: builds both client libraries and checks the headers, .pc and CMake "
          "package are in the image")
    runtime = text[text.rindex("\nFROM "):]
    copy = runtime.find("COPY --from=build /out/ /")
    check(copy >= 0 and runtime.find("RUN ldconfig", copy) > copy,
          "Containerfile: ldconfig after the installed files are copied in")


def check_labels(deploy, text):
    """OCI labels on the runtime image; HEALTHCHECK kept by building in the docker format."""
    runtime = text[text.rindex("\nFROM "):].replace("\\\n", " ")
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"', runtime))
    for name in OCI_LABELS:
        check(f"org.opencontainers.image.{name}" in labels,
              f"Containerfile: label org.opencontainers.image.{name}")
    version = project_version(deploy)
    args = dict(re.findall(r"^ARG (\w+)=(\S*)", text, re.M))
    check(version is not None and args.get("VERSION") == version,
          f"Containerfile: ARG VERSION={args.get('VERSION')} is the project's version ({version})")
    check(labels.get("org.opencontainers.image.version") == "${VERSION}",
          "Containerfile: the version label is ARG VERSION")
    if not check(re.search(r"^HEALTHCHECK ", text, re.M) is not None, "Containerfile: HEALTHCHECK"):
        return
    with open(os.path.join(deploy, "README.md")) as f:
        readme = f.read()
    check("podman build --format docker" in text and "podman build --format docker" in readme,
          "Containerfile and README: podman builds with --format docker (keeps the HEALTHCHECK)")
    check_build_image(deploy, version)


def check_build_image(deploy, version):
    """deploy/build-image.sh, run with a stand-in podman that prints its arguments."""
    with tempfile.TemporaryDirectory() as tmp:
        fake = os.path.join(tmp, "podman")
        with open(fake, "w") as f:
            f.write('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
        os.chmod(fake, 0o755)
        r = subprocess.run([os.path.join(deploy, "build-image.sh"), "-t", "attnd:test"],
                           env=dict(os.environ, ATTND_IMAGE_ENGINE=fake), capture_output=True,
                           text=True, timeout=60)
    args = r.stdout.split("\n")
    ok = r.returncode == 0 and args[:3] == ["build", "--format", "docker"]
    check(ok, f"build-image.sh: podman build --format docker ({' '.join(args[:3])}{r.stderr.strip()})")
    check(f"VERSION={version}" in args and "REVISION" in r.stdout and "CREATED=" in r.stdout
          and os.path.realpath(os.path.join(deploy, "Containerfile")) in args,
          "build-image.sh: passes the Containerfile and the version, revision and date labels")


def main(argv):
    attnd = None
    if len(argv) > 1 and argv[1] == "--attnd":
        attnd = argv[2]
        argv = argv[:1] + argv[3:]
    deploy = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    cm_name, configs = check_configmap(deploy, attnd)
    check_daemonset(deploy, cm_name, configs)
    check_engine_example(deploy)
    check_mps(deploy)
    check_containerfile(deploy, attnd)
    print(f"{len(FAILURES)} failed" if FAILURES else "all deploy checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
