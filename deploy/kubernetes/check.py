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
   variable and `--flag` the DaemonSet gives `gossamer serve` is one the binary accepts.

Usage: check.py GOSSAMER_BINARY [KUBERNETES_VERSION]. Exits 1 on any failure.
"""

import copy
import os
import subprocess
import sys
import tempfile

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
    if failures:
        print(f"\n{len(failures)} problem(s) in deploy/kubernetes")
        return 1
    print("\ndeploy/kubernetes: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
