#!/usr/bin/env python3
"""Offline checks of deploy/envoy, run by .ci/run (needs PyYAML). No Envoy binary can be
fetched from the registries CI reaches, so this checks what would break the pairing:

1. envoy.yaml: the rate limit filter names a cluster that exists, speaks the v3 API, and
   sits before the router; that cluster is HTTP/2 (gRPC) and points at the address gossamer
   listens on for gRPC (gossamer.toml, [server] grpc);
2. every descriptor key the routes' rate_limits actions produce is a top-level key of the
   filter's domain in ratelimit/ (a key that is not there is never limited);
3. `gossamer config check gossamer.toml` accepts the TOML and the YAML it names.

Usage: check.py GOSSAMER_BINARY. Exits 1 on any failure.
"""

import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.abspath(__file__))
failures = []


def fail(message):
    failures.append(message)
    print(f"FAIL {message}")


def grpc_address(toml_path):
    """[server] grpc from gossamer.toml (a flat read: the file is ours and simple)."""
    section = None
    with open(toml_path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line.startswith("["):
                section = line
            elif section == "[server]" and line.startswith("grpc"):
                return line.split("=", 1)[1].strip().strip('"')
    return None


def action_keys(action):
    """The descriptor key an Envoy rate limit action produces."""
    if "remote_address" in action:
        return ["remote_address"]
    if "request_headers" in action:
        return [action["request_headers"]["descriptor_key"]]
    if "generic_key" in action:
        return [action["generic_key"].get("descriptor_key", "generic_key")]
    if "header_value_match" in action:
        return [action["header_value_match"].get("descriptor_key", "header_match")]
    if "source_cluster" in action:
        return ["source_cluster"]
    if "destination_cluster" in action:
        return ["destination_cluster"]
    fail(f"rate limit action this check does not know: {action}")
    return []


def main(binary):
    with open(os.path.join(ROOT, "envoy.yaml")) as f:
        envoy = yaml.safe_load(f)
    clusters = {c["name"]: c for c in envoy["static_resources"]["clusters"]}
    filters = []
    routes = []
    for listener in envoy["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network in chain["filters"]:
                hcm = network["typed_config"]
                names = [f["name"] for f in hcm.get("http_filters", [])]
                for f in hcm.get("http_filters", []):
                    if f["name"] == "envoy.filters.http.ratelimit":
                        filters.append(f["typed_config"])
                        if names.index(f["name"]) > names.index("envoy.filters.http.router"):
                            fail("the rate limit filter comes after the router")
                for vhost in hcm["route_config"]["virtual_hosts"]:
                    routes.extend(vhost.get("rate_limits", []))
                    for route in vhost["routes"]:
                        routes.extend(route.get("route", {}).get("rate_limits", []))
    if not filters:
        fail("no envoy.filters.http.ratelimit filter")
    expected = grpc_address(os.path.join(ROOT, "gossamer.toml"))
    if expected is None:
        fail("gossamer.toml sets no [server] grpc")
    domains = {}
    rls_dir = os.path.join(ROOT, "ratelimit")
    for name in sorted(os.listdir(rls_dir)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(rls_dir, name)) as f:
                doc = yaml.safe_load(f)
            domains[doc["domain"]] = {d["key"] for d in doc.get("descriptors", [])}
    for config in filters:
        service = config["rate_limit_service"]
        if service.get("transport_api_version") != "V3":
            fail("rate_limit_service.transport_api_version must be V3")
        cluster_name = service["grpc_service"]["envoy_grpc"]["cluster_name"]
        cluster = clusters.get(cluster_name)
        if cluster is None:
            fail(f"the rate limit service's cluster {cluster_name!r} is not defined")
            continue
        options = cluster.get("typed_extension_protocol_options", {}).get(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", {}
        )
        if "http2_protocol_options" not in options.get("explicit_http_config", {}):
            fail(f"cluster {cluster_name!r} is not HTTP/2 (gRPC needs it)")
        for group in cluster["load_assignment"]["endpoints"]:
            for endpoint in group["lb_endpoints"]:
                socket = endpoint["endpoint"]["address"]["socket_address"]
                address = f"{socket['address']}:{socket['port_value']}"
                if address != expected:
                    fail(f"cluster {cluster_name!r} points at {address}, gossamer listens on {expected}")
        domain = config["domain"]
        if domain not in domains:
            fail(f"domain {domain!r} is in no file of ratelimit/ ({sorted(domains)})")
            continue
        for limit in routes:
            for action in limit["actions"]:
                for key in action_keys(action):
                    if key not in domains[domain]:
                        fail(f"descriptor key {key!r} has no limit in domain {domain!r}")
    result = subprocess.run(
        [binary, "config", "check", os.path.join(ROOT, "gossamer.toml")],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        fail(f"gossamer config check: {result.stderr.strip()}")
    else:
        print(result.stdout.strip())
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("deploy/envoy: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
