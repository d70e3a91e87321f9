#!/usr/bin/env python3
"""Offline checks of deploy/kubernetes, run by .ci/run (needs PyYAML and kubernetes-validate).

No kustomize binary is available from the package registries CI can reach, so this script
does the part of `kustomize build` these manifests use, and checks its output:

1. every resource and patch a kustomization.yaml lists exists, and every patch targets a
   resource (kind, name) that the kustomization's resources define;
2. each kustomization is rendered: resources loaded (recursively for a base), patches applied
   as strategic merges (maps merged, lists of named items merged by `name`, other lists
   replaced), `images` rewritten; then every rendered resource is validated against the
   Kubernetes API schemas (kubernetes-validate, strict: unknown fields fail). Custom
   resources (cert-manager) have no schema there and are only parsed;
3. every ConfigMap's gossamer.toml passes `gossamer config check`, and every `GOSSAMER_*`
   variable and `--flag` the DaemonSet gives `gossamer serve` is one the binary accepts;
4. every Secret a container mounts is readable by the user it runs as: the kubelet writes
   Secret files owned by root, group root or the pod's `fsGroup`, with `defaultMode` (0644
   unless set), so a non-root user needs the "other" read bit, or the group read bit and an
   `fsGroup` (or group 0);
5. the DaemonSet runs on every node: it tolerates every taint (`operator: Exists`), or the
   node's own system taints would leave tainted machines without a limiter (and their apps
   failing open or closed);
6. the DaemonSet's memory request and limit cover what its ConfigMap's `max_keys` can hold,
   at BYTES_PER_KEY plus BASE_BYTES.

Usage: check.py GOSSAMER_BINARY [KUBERNETES_VERSION]. Exits 1 on any failure.
"""

import copy
import os
import subprocess
import sys
import tempfile
import tomllib

import kubernetes_validate
import yaml

ROOT = os.path.dirname(os.path.abspath(__file__))
KUSTOMIZATIONS = ["base", "overlays/example"]
failures = []


def fail(message):
    failures.append(message)
    print(f"FAIL {message}")


def load_documents(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def key(resource):
    return (resource.get("kind"), resource.get("metadata", {}).get("name"))


def merge(base, patch):
    """A strategic merge, as far as these manifests need it."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list):
        named = all(isinstance(i, dict) and "name" in i for i in base + patch)
        if named and base:
            out = [copy.deepcopy(i) for i in base]
            for item in patch:
                for n, existing in enumerate(out):
                    if existing["name"] == item["name"]:
                        out[n] = merge(existing, item)
                        break
                else:
                    out.append(copy.deepcopy(item))
            return out
    return copy.deepcopy(patch)


def set_images(resources, images):
    for resource in resources:
        spec = resource.get("spec", {}).get("template", {}).get("spec", {})
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            name, _, tag = container["image"].partition(":")
            for image in images:
                if image["name"] == name:
                    container["image"] = (
                        f"{image.get('newName', name)}:{image.get('newTag', tag)}"
                    )


def build(directory):
    """Renders the kustomization in `directory` (a subset of kustomize build)."""
    path = os.path.join(directory, "kustomization.yaml")
    relative = os.path.relpath(path, ROOT)
    if not os.path.isfile(path):
        fail(f"{relative}: missing")
        return []
    kustomization = yaml.safe_load(open(path))
    known = {"apiVersion", "kind", "resources", "patches", "images"}
    for field in set(kustomization) - known:
        fail(f"{relative}: field {field!r} is not handled by this check")
    resources = []
    for entry in kustomization.get("resources", []):
        target = os.path.normpath(os.path.join(directory, entry))
        if os.path.isdir(target):
            resources += build(target)
        elif os.path.isfile(target):
            resources += load_documents(target)
        else:
            fail(f"{relative}: resource {entry} does not exist")
    for entry in kustomization.get("patches", []):
        target = os.path.join(directory, entry.get("path", ""))
        if not os.path.isfile(target):
            fail(f"{relative}: patch {entry} does not exist")
            continue
        for patch in load_documents(target):
            matches = [i for i, r in enumerate(resources) if key(r) == key(patch)]
            if not matches:
                fail(f"{relative}: patch {entry['path']} targets {key(patch)}, which no resource defines")
            for i in matches:
                resources[i] = merge(resources[i], patch)
    set_images(resources, kustomization.get("images", []))
    seen = set()
    for r in resources:
        k = (key(r), r.get("metadata", {}).get("namespace"))
        if k in seen:
            fail(f"{relative}: {k} defined twice")
        seen.add(k)
    return resources


def validate(name, resources, version):
    for resource in resources:
        label = f"{name}: {resource.get('kind')}/{resource.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(resource, version, strict=True)
            print(f"ok   {label}")
        except kubernetes_validate.SchemaNotFoundError:
            print(f"skip {label}: no schema (custom resource), parsed only")
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            fail(f"{label}: {path}: {e.message}")


def check_config(name, resources, binary):
    for resource in resources:
        if resource.get("kind") != "ConfigMap":
            continue
        for file, text in resource.get("data", {}).items():
            if not file.endswith(".toml"):
                continue
            with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
                f.write(text)
            try:
                run = subprocess.run(
                    [binary, "config", "check", f.name], capture_output=True, text=True, timeout=30
                )
            finally:
                os.unlink(f.name)
            label = f"{name}: ConfigMap/{resource['metadata']['name']} {file}"
            if run.returncode == 0:
                print(f"ok   {label}: gossamer config check")
            else:
                fail(f"{label}: gossamer config check: {run.stderr.strip()}")


def check_flags(name, resources, binary):
    help_text = subprocess.run(
        [binary, "serve", "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    for resource in resources:
        if resource.get("kind") != "DaemonSet":
            continue
        for container in resource["spec"]["template"]["spec"]["containers"]:
            args = container.get("args", [])
            if args[:1] != ["serve"]:
                fail(f"{name}: DaemonSet container {container['name']}: args must start with serve")
            for arg in args:
                if arg.startswith("--") and f"{arg.split('=')[0]} " not in help_text:
                    fail(f"{name}: DaemonSet: gossamer serve has no flag {arg}")
            for env in container.get("env", []):
                if env["name"].startswith("GOSSAMER_") and f"env: {env['name']}=" not in help_text:
                    fail(f"{name}: DaemonSet: gossamer serve reads no variable {env['name']}")
        print(f"ok   {name}: DaemonSet flags and GOSSAMER_* variables match gossamer serve --help")


def pod_specs(resources):
    for resource in resources:
        spec = resource.get("spec", {}).get("template", {}).get("spec")
        if spec is not None:
            yield resource, spec


def readable(mode, uid, gid, fs_group, supplemental):
    """Whether a file the kubelet wrote (owner root, group fs_group or root) with `mode` can
    be read by uid/gid."""
    if uid == 0:
        return True
    if mode & 0o004:
        return True
    groups = {gid, *supplemental}
    file_group = fs_group if fs_group is not None else 0
    return bool(mode & 0o040) and file_group in groups


def check_secret_access(name, resources):
    for resource, spec in pod_specs(resources):
        pod = spec.get("securityContext", {})
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec.get("containers", []):
            ctx = {**pod, **container.get("securityContext", {})}
            uid, gid = ctx.get("runAsUser"), ctx.get("runAsGroup", ctx.get("runAsUser"))
            if uid is None:
                fail(f"{name}: {resource['kind']}/{resource['metadata']['name']}: runAsUser unset, "
                     "cannot check which files it can read")
                continue
            for mount in container.get("volumeMounts", []):
                secret = volumes.get(mount["name"], {}).get("secret")
                if secret is None:
                    continue
                modes = [secret.get("defaultMode", 0o644)]
                modes += [item["mode"] for item in secret.get("items", []) if "mode" in item]
                for mode in modes:
                    label = (f"{name}: {resource['kind']}/{resource['metadata']['name']} "
                             f"container {container['name']}: Secret {secret.get('secretName')}")
                    if readable(mode, uid, gid, pod.get("fsGroup"), pod.get("supplementalGroups", [])):
                        print(f"ok   {label} mode {mode:04o} is readable by uid {uid}")
                    else:
                        fail(f"{label} mode {mode:04o} is not readable by uid {uid} "
                             f"(gid {gid}, fsGroup {pod.get('fsGroup')})")


def check_tolerations(name, resources):
    for resource, spec in pod_specs(resources):
        if resource.get("kind") != "DaemonSet":
            continue
        label = f"{name}: DaemonSet/{resource['metadata']['name']}"
        everything = any(
            t.get("operator") == "Exists" and "key" not in t and "effect" not in t
            for t in spec.get("tolerations", [])
        )
        if everything:
            print(f"ok   {label} tolerates every taint")
        else:
            fail(f"{label} does not tolerate every taint: tainted nodes get no limiter")


#: Memory per key the manifests are sized for, and per node besides the keys: see the
#: comment on the DaemonSet's resources.
BYTES_PER_KEY = 2250
BASE_BYTES = 20 * 2**20

UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}


def quantity(text):
    text = str(text)
    for suffix, factor in UNITS.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def check_memory(name, resources):
    max_keys = None
    for resource in resources:
        if resource.get("kind") == "ConfigMap":
            text = resource.get("data", {}).get("gossamer.toml")
            if text is not None:
                max_keys = tomllib.loads(text).get("server", {}).get("max_keys", 1_000_000)
    if max_keys is None:
        return
    needed = max_keys * BYTES_PER_KEY + BASE_BYTES
    for resource, spec in pod_specs(resources):
        if resource.get("kind") != "DaemonSet":
            continue
        for container in spec.get("containers", []):
            res = container.get("resources", {})
            label = f"{name}: DaemonSet container {container['name']}"
            for which in ("requests", "limits"):
                value = res.get(which, {}).get("memory")
                if value is None or quantity(value) < needed:
                    fail(f"{label}: memory {which} {value} < max_keys {max_keys} x "
                         f"{BYTES_PER_KEY} B + {BASE_BYTES // 2**20} MiB = {needed / 2**20:.0f} MiB")
                else:
                    print(f"ok   {label}: memory {which} {value} >= {needed / 2**20:.0f} MiB "
                          f"(max_keys {max_keys})")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    binary = sys.argv[1]
    version = sys.argv[2] if len(sys.argv) > 2 else "1.30.0"
    for name in KUSTOMIZATIONS:
        resources = build(os.path.join(ROOT, name))
        validate(name, resources, version)
        check_config(name, resources, binary)
        check_flags(name, resources, binary)
        check_secret_access(name, resources)
        check_tolerations(name, resources)
        check_memory(name, resources)
    if failures:
        print(f"\n{len(failures)} problem(s) in deploy/kubernetes")
        return 1
    print("\ndeploy/kubernetes: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
