"""Facts about this device's GPU: its name, driver, CUDA, cuDNN and TensorRT versions, the
memory this process holds there. Shipped only in a bundle whose providers include a GPU one."""

import functools
import glob
import os
import re
import subprocess


@functools.lru_cache(maxsize=None)   # a directory scan; asked per session and per cache key
def tensorrt_version():
    """TensorRT's version from its library's file name (libnvinfer.so.X.Y.Z), else 'unknown'."""
    dirs = ["/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64"]
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    found = []
    for d in dirs:
        for path in glob.glob(os.path.join(d, "libnvinfer.so.*")):
            match = re.search(r"libnvinfer\.so\.([\d.]+)$", path)
            if match:
                found.append(match.group(1))
    return max(found, key=lambda v: [int(x) for x in v.split(".") if x]) if found else "unknown"


@functools.lru_cache(maxsize=None)   # may run nvidia-smi: once per process
def gpu_name():
    """The Jetson module's name, or the first GPU's name and compute capability, else 'unknown'."""
    try:
        with open("/proc/device-tree/model") as f:
            model = f.read().strip("\x00\n ")
        if model:
            return model
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def loaded_library(prefix):
    """The file of a loaded shared library named PREFIX.so*, from /proc/self/maps, else None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                if os.path.basename(path).startswith(prefix + ".so"):
                    return path
    except OSError:
        pass
    return None


def _library_call(prefix, function):
    """FUNCTION of the loaded library PREFIX (loaded by onnxruntime: no new CUDA context)."""
    import ctypes

    path = loaded_library(prefix)
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        return getattr(lib, function), ctypes
    except (OSError, AttributeError):
        return None


def _int_out(prefix, function, *args):
    found = _library_call(prefix, function)
    if found is None:
        return None
    fn, ctypes = found
    value = ctypes.c_int(0)
    try:
        return value.value if fn(ctypes.byref(value), *args) == 0 else None
    except Exception:
        return None


def _version(number, width):
    """12040 -> '12.4' (CUDA, width 1000 major), 90100 -> '9.1.0' (cuDNN 9 / TensorRT 10)."""
    if not number:
        return None
    if width == 1000:
        return "%d.%d" % (number // 1000, number % 1000 // 10)
    major = number // 10000 if number >= 10000 else number // 1000
    rest = number % 10000 if number >= 10000 else number % 1000
    return "%d.%d.%d" % (major, rest // 100, rest % 100)


def gpu_facts():
    """GPU, driver, CUDA, cuDNN and TensorRT versions as loaded by this process's onnxruntime
    (call after a GPU session started); None where unknown."""
    facts = {"name": None, "compute_capability": None, "driver": None, "cuda_driver": None,
             "cuda_runtime": None, "cudnn": None, "tensorrt": None}
    facts["cuda_runtime"] = _version(_int_out("libcudart", "cudaRuntimeGetVersion"), 1000)
    facts["cuda_driver"] = _version(_int_out("libcudart", "cudaDriverGetVersion"), 1000)
    major = _int_out("libcudart", "cudaDeviceGetAttribute", 75, 0)
    minor = _int_out("libcudart", "cudaDeviceGetAttribute", 76, 0)
    if major is not None and minor is not None:
        facts["compute_capability"] = "%d.%d" % (major, minor)
    for key, prefix, function, size in (("cudnn", "libcudnn", "cudnnGetVersion", True),
                                        ("tensorrt", "libnvinfer", "getInferLibVersion", False)):
        found = _library_call(prefix, function)
        if found is not None:
            fn, ctypes = found
            fn.restype = ctypes.c_size_t if size else ctypes.c_int
            try:
                facts[key] = _version(int(fn()), 10000)
            except Exception:
                pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10)
        fields = [x.strip() for x in out.stdout.splitlines()[0].split(",")] \
            if out.returncode == 0 and out.stdout.strip() else []
        if len(fields) == 3:
            facts["name"] = fields[0]
            facts["compute_capability"] = facts["compute_capability"] or fields[1]
            facts["driver"] = fields[2]
    except (OSError, subprocess.SubprocessError):
        pass
    if facts["name"] is None:
        name = gpu_name()
        facts["name"] = None if name == "unknown" else name
    return facts


def gpu_memory_mb():
    """GPU memory this process holds (nvidia-smi), or None where it cannot tell (a Jetson's
    integrated GPU shares the RAM: see peak RSS there)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.stdout.splitlines():
        fields = [x.strip() for x in line.split(",")]
        if len(fields) == 2 and fields[0] == str(os.getpid()):
            try:
                return float(fields[1])
            except ValueError:
                return None
    return None
