"""A bundle's CPU architecture against a device's `uname -m`: the one line both engines say."""

from typing import Any

# what `uname -m` (Python's platform.machine()) says on one architecture under other names
SAME = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8l": "aarch64"}
FORCE = "--force"


def canonical(arch: str) -> str:
    arch = arch.strip().lower()
    return SAME.get(arch, arch)


def arch_problem(manifest: dict[str, Any], device_arch: Any) -> str | None:
    """One line when the bundle's target arch is not the device's (None when they match, or
    when the bundle or the device does not say). The Ansible role builds the same line."""
    target = manifest.get("target") if isinstance(manifest.get("target"), dict) else {}
    bundle_arch = target.get("arch")
    if not isinstance(bundle_arch, str) or not bundle_arch or not isinstance(device_arch, str) \
            or not device_arch:
        return None
    if canonical(bundle_arch) == canonical(device_arch):
        return None
    return (f"the bundle is for {bundle_arch} (target {target.get('name', '?')}) but the "
            f"device is {device_arch} (uname -m); build it for the device's target, or pass "
            f"{FORCE} to deploy it anyway")
