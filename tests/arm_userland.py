"""An aarch64 userland run under qemu, for testing bundles as an ARM board would run them.

Built once and cached (EDGEPACK_ARM_CACHE, default ~/.cache/edgepack/arm): Debian's arm64
python3, unpacked by mmdebstrap without running anything emulated, plus PyPI's aarch64 wheels
of onnxruntime and numpy, installed by this machine's pip. Building needs root, qemu-user-static
and mmdebstrap (Debian packages) and the network to Debian's mirror and PyPI; running needs
qemu only.

    python tests/arm_userland.py py311    # bookworm: Python 3.11 + the newest onnxruntime
    python tests/arm_userland.py py39     # bullseye: Python 3.9 + onnxruntime 1.19.2 (JetPack 5 era)
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

USERLANDS = {
    # name: (Debian suite, Python, glibc minor version, packages)
    "py311": ("bookworm", "3.11", 36, ["onnxruntime", "numpy"]),
    "py39": ("bullseye", "3.9", 31, ["onnxruntime==1.19.2", "numpy"]),
}
TOOLS = ("qemu-aarch64-static", "mmdebstrap")
# onnxruntime crashes under qemu when it reads the host's x86 /proc/cpuinfo: give it a Pi 4's.
CPUINFO = "".join(f"""processor\t: {i}
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd08
CPU revision\t: 3

""" for i in range(4)) + "Hardware\t: BCM2835\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n"


def cache_dir() -> Path:
    return Path(os.environ.get("EDGEPACK_ARM_CACHE", Path.home() / ".cache" / "edgepack" / "arm"))


def root_of(name: str) -> Path:
    return cache_dir() / name


def is_built(name: str) -> bool:
    return (root_of(name) / ".complete").is_file()


def problem(name: str) -> str | None:
    """Why the userland cannot be used here, or None."""
    if not shutil.which("qemu-aarch64-static"):
        return "qemu-aarch64-static is missing: apt-get install qemu-user-static mmdebstrap"
    if is_built(name):
        return None
    if not shutil.which("mmdebstrap"):
        return "mmdebstrap is missing: apt-get install mmdebstrap qemu-user-static"
    if os.geteuid() != 0:
        return (f"building the aarch64 userland needs root (mmdebstrap --mode=root); run "
                f"`sudo python tests/arm_userland.py {name}` once, or run the tests as root")
    return None


def mirror() -> str:
    """The Debian mirror this machine's apt uses."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    sources = Path("/etc/apt/sources.list")
    if sources.is_file():
        for line in sources.read_text().splitlines():
            parts = line.split()
            if parts[:1] == ["deb"] and "security" not in line:
                return parts[1] if not parts[1].startswith("[") else parts[2]
    return "http://deb.debian.org/debian"


def build(name: str, log=print) -> Path:
    """Build the userland *name* into the cache (atomically) unless it is there already."""
    if is_built(name):
        return root_of(name)
    suite, python, glibc, packages = USERLANDS[name]
    cache_dir().mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache_dir()))
    try:
        log(f"arm: unpacking Debian {suite} arm64 python3 into {tmp}")
        subprocess.run(["mmdebstrap", "--variant=extract", "--mode=root", "--architectures=arm64",
                        "--include=python3,libstdc++6,coreutils", suite, str(tmp), mirror()],
                       check=True, capture_output=True, text=True)
        site = tmp / "usr" / "local" / "lib" / f"python{python}" / "dist-packages"
        platforms = ["--platform", "manylinux2014_aarch64"]
        for minor in range(17, glibc + 1):   # every tag up to this glibc, or pip picks old wheels
            platforms += ["--platform", f"manylinux_2_{minor}_aarch64"]
        log(f"arm: installing {' '.join(packages)} for Python {python} aarch64")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site),
                        "--only-binary=:all:", "--implementation", "cp", "--python-version",
                        python, "--abi", f"cp{python.replace('.', '')}", *platforms, *packages],
                       check=True, capture_output=True, text=True)
        (tmp / "proc").mkdir(exist_ok=True)
        (tmp / "proc" / "cpuinfo").write_text(CPUINFO)
        (tmp / ".complete").write_text(f"{suite} python{python} {' '.join(packages)}\n")
        shutil.rmtree(root_of(name), ignore_errors=True)
        os.replace(tmp, root_of(name))
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-3:]
        raise RuntimeError(f"building the {name} userland failed: {' | '.join(tail)}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root_of(name)


# The CPU qemu emulates: a Raspberry Pi 4's. qemu's default ("max": SVE2, i8mm, SME) is no Pi,
# and there onnxruntime 1.31.1's optimised dynamic-INT8 encoder gave cosine 0.14 against the
# golden outputs, while cortex-a72, cortex-a76 (Pi 5) and neoverse-n1 all matched (0.9999).
CPU = "cortex-a72"


def python(name: str, cpu: str = CPU) -> list[str]:
    """The command that runs the userland's python3 under qemu, emulating *cpu*."""
    root = root_of(name)
    return ["qemu-aarch64-static", "-cpu", cpu, "-L", str(root),
            str(root / "usr" / "bin" / "python3")]


if __name__ == "__main__":
    for arg in sys.argv[1:] or list(USERLANDS):
        reason = problem(arg)
        if reason:
            sys.exit(f"error: {reason}")
        print(build(arg))
