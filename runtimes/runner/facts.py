"""Facts about this device: CPU, power mode, memory. (The GPU's: gpu_facts.py.)"""

import os
import platform
import re
import subprocess
import sys


def device_info():
    import onnxruntime as ort

    info = {"arch": platform.machine(), "cpu": platform.processor() or "", "cores": os.cpu_count(),
            "python": platform.python_version(), "onnxruntime": ort.__version__,
            "available_providers": ort.get_available_providers()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":")[0].strip()
                if key in ("model name", "Model") and ":" in line:
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    for key, path in (("governor", "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
                      ("cpu_max_mhz", "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"),
                      ("board", "/proc/device-tree/model")):
        try:
            with open(path) as f:
                value = f.read().strip("\x00\n ")
        except OSError:
            continue
        info[key] = int(value) // 1000 if key == "cpu_max_mhz" and value.isdigit() else value
    power = jetson_power_mode()
    if power:
        info["nvpmodel"] = power
    return info


def jetson_power_mode():
    """The Jetson power mode (`nvpmodel -q`), e.g. 'MAXN', or None off a Jetson."""
    try:
        out = subprocess.run(["nvpmodel", "-q"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"NV Power Mode:\s*(.+)", out.stdout)
    return match.group(1).strip() if match else None


def peak_rss_mb():
    """This process's peak resident memory in MB. Linux: VmHWM, which exec resets; getrusage's
    ru_maxrss keeps the parent's peak across fork + exec (883 MB for a 77 KB model run from
    `edgepack verify`, 72 MB from a shell)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0
