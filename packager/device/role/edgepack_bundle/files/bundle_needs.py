"""What a device needs for a bundle: the one rule of deploy's preflight, for both engines.

`deploy --engine ssh` imports it (packager/device/deploy.py); the edgepack_bundle role's
bundle_info.py imports it on the Ansible controller (it sits beside it in files/), and
`deploy --engine ansible` reads its notes from the device's answer the role brings back.
Standard library only (Python 3.8+): the controller needs nothing from edgepack.

A provider the build listed with "when": "faster" (OpenVINO: measured faster at build, the CPU
provider's own graph kept as the fallback) is not needed: a device without it runs the next
provider it has, with that provider's graph, and deploy says so in a note. Any other listed
provider the device lacks is a refusal (device_probe.py's problems), unless allow_fallback.
"""

FASTER = "faster"
CPU = "CPUExecutionProvider"   # run.py tries it last whatever the manifest lists


def needs(manifest, bundle_bytes, allow_fallback=False):
    """What the device must have for *manifest*, as device_probe.py's problems reads it."""
    target = manifest["target"]
    return {"runtime_package": target["runtime_package"],
            "min_onnxruntime": target["min_onnxruntime"], "install": target.get("install"),
            "providers": required_providers(manifest),
            "allow_fallback": bool(allow_fallback), "need_mb": 2 * bundle_bytes / 1e6 + 50}


def required_providers(manifest):
    """The listed providers the device must have: all but those listed for speed."""
    return [p["name"] for p in manifest.get("providers", []) if p.get("when") != FASTER]


def runs_instead(manifest, device_providers):
    """The provider run.py opens on a device with *device_providers*: the first one listed
    that the device has, else the CPU provider."""
    listed = [p["name"] for p in manifest.get("providers", [])]
    return next((n for n in listed + [CPU] if n in device_providers), CPU)


def graph_of(manifest, provider):
    """The graph(s) *provider* runs, as run.py picks them: a part's own graph for it where the
    part ships one, else the part's model; "file, PRECISION", per part when there are several."""
    shown = []
    for part in manifest.get("parts", []):
        graph = next((g for g in part.get("graphs", []) if provider in g.get("providers", [])),
                     None)
        if graph is None:
            graph = dict(part["model"], precision=(part.get("precision") or {}).get("precision"))
        text = graph["file"] + (", %s" % graph["precision"].upper()
                                if graph.get("precision") else "")
        shown.append(text if len(manifest["parts"]) == 1 else "%s: %s" % (part["name"], text))
    return "; ".join(shown) or "?"


def fallback_notes(manifest, device_providers):
    """One line per provider listed for speed that the device's onnxruntime lacks: which
    provider and graph the device runs instead, and how to get the measured speed."""
    have = list(device_providers or [])
    runs = runs_instead(manifest, have)
    return [_note(manifest, p["name"], runs) for p in manifest.get("providers", [])
            if p.get("when") == FASTER and p["name"] not in have]


def notes_if_missing(manifest):
    """{provider: its note} for each provider listed for speed, as on a device that lacks it
    and has the required ones (a device past preflight): the role shows those its device lacks
    before the check runs."""
    runs = runs_instead(manifest, required_providers(manifest) + [CPU])
    return {p["name"]: _note(manifest, p["name"], runs) for p in manifest.get("providers", [])
            if p.get("when") == FASTER}


def _note(manifest, name, runs):
    target = manifest["target"]
    install = target.get("install") or "pip install %s" % target["runtime_package"]
    return ("%s (measured faster at build) is not in the device's onnxruntime, so the device "
            "runs %s's graph (%s); for %s's measured speed there: %s" % (
                name, runs, graph_of(manifest, runs), name.replace("ExecutionProvider", ""),
                install))
