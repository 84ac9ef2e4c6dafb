"""What a bundle's runner holds: its files by group, the ones a bundle's table must list, and
the modules a bundle ships only when it uses them, loaded on demand.

    RUNNER_CORE          run.py and the modules every bundle ships (load, check, run, bench)
    RUNNER_TASKS         tasks' checks, figures and judgement: when a part has a task
    RUNNER_HEADS         {task kind: its head}: shipped when a part has a task of that kind
    RUNNER_EXTRAS        {extra: its modules}: infer (infer, bench FILE), serve (with infer's),
                         tune (bench --tune, session.tuned.json read back), profile (bench
                         --profile), roofline (bench --roofline, with its graphs); a build ships
                         EXTRAS unless told fewer (--runner-extras)
    RUNNER_IMAGES        image decoding: only a bundle with a part that takes images
    RUNNER_GPU           the GPU's facts: only a bundle whose providers include a GPU one
    RUNNER_CASCADE       the cascade's modules: only a bundle with a `pipeline` ships them
    runner_files(m, e)   what a bundle with manifest *m* and extras *e* ships (the build's list)
    runner_needed(m)     what its file table must list, whichever edgepack built it
    optional_module(n)   a group's module, or one line (exit 2) saying the bundle lacks it
    extra_module(n, m)   an extra's module, or one line saying how to build a bundle with it
"""

import importlib
import os

from .errors import BundleError

RUNNER_FILE = "run.py"
RUNNER_DIR = "runner"
# The runner's files, each hashed in the manifest. run.py's RUNNER_MODULES and OPTIONAL_MODULES
# name the same (run.py checks runner/ before it imports any of it).
RUNNER_CORE = ("run.py", "runner/__init__.py", "runner/bench.py", "runner/check.py",
               "runner/cli.py", "runner/contents.py", "runner/errors.py", "runner/facts.py",
               "runner/load.py", "runner/manifest.py", "runner/metrics.py", "runner/places.py",
               "runner/report.py", "runner/sessions.py")
TENSORRT = "TensorrtExecutionProvider"
GPU_PROVIDERS = (TENSORRT, "CUDAExecutionProvider")   # sessions.py and the packager read these
RUNNER_GPU = ("runner/gpu_facts.py", "runner/tensorrt.py")
RUNNER_IMAGES = ("runner/images.py",)
RUNNER_TASKS = ("runner/task_figures.py", "runner/task_spec.py", "runner/tasks.py")
HEAD_KINDS = ("classify", "detect", "embed", "ctc", "segment", "vad", "multilabel", "tts")
RUNNER_HEADS = dict((kind, "runner/task_%s.py" % kind) for kind in HEAD_KINDS)
EXTRAS = ("infer", "serve", "tune", "profile", "roofline")
RUNNER_EXTRAS = {"infer": ("runner/infer.py", "runner/inputs.py", "runner/stages.py"),
                 "serve": ("runner/closing.py", "runner/serve.py", "runner/serve_body.py",
                           "runner/serve_http.py"),
                 "tune": ("runner/tuned.py", "runner/tuning.py"),
                 "profile": ("runner/profile.py",),
                 "roofline": ("runner/roofline.py",)}
NEEDS = {"serve": ("infer",)}   # an extra that answers through another's modules
EXTRA_OF = {"infer": "infer", "stages": "infer", "serve": "serve", "tuning": "tune",
            "tuned": "tune", "profile": "profile", "roofline": "roofline"}   # module -> extra
CASCADE_MODULES = ("runner/cascade.py", "runner/cascade_face.py", "runner/cascade_judge.py",
                   "runner/cascade_ocr.py", "runner/cascade_spec.py", "runner/cascade_tts.py")
# what every pipeline bundle since the cascade's split lists (cascade_tts.py came later)
CASCADE_NEEDED = ("runner/cascade.py", "runner/cascade_face.py", "runner/cascade_judge.py",
                  "runner/cascade_ocr.py", "runner/cascade_spec.py")
# the cascade decodes photos, reads boxes and text with the detect and ctc heads' functions,
# and judges speech with the tts head's
RUNNER_CASCADE = CASCADE_MODULES + RUNNER_IMAGES + RUNNER_TASKS + (
    RUNNER_HEADS["ctc"], RUNNER_HEADS["detect"], RUNNER_HEADS["tts"])
RUNNER_FILES = tuple(sorted(set(RUNNER_CORE + tuple(RUNNER_HEADS.values()) + RUNNER_CASCADE +
                                RUNNER_GPU + RUNNER_IMAGES + RUNNER_TASKS +
                                sum(RUNNER_EXTRAS.values(), ()))))   # every file a runner may hold


# What any bundle's runner package holds, whichever edgepack built it: its entry modules. The
# rest of a bundle's runner is what its file table lists (a module added later is not asked of
# a bundle built before it; the bundle's own run.py refuses a runner/ that lacks one of its own).
RUNNER_ENTRY = ("run.py", "runner/__init__.py", "runner/cli.py", "runner/manifest.py")


def task_kind(task):
    """The task's kind: 'raw' when there is none."""
    if not task:
        return "raw"
    return task.get("kind", "raw") if isinstance(task, dict) else "raw"


def part_kinds(manifest):
    """The task kinds of the manifest's parts that have a head (not raw, not unknown)."""
    return set(kind for kind in (task_kind(part.get("task")) for part in
                                 manifest.get("parts") or () if isinstance(part, dict))
               if kind in RUNNER_HEADS)


def has_tasks(manifest):
    """Whether a part of the manifest has a task (then its checks and judgement ship)."""
    return any(isinstance(part, dict) and part.get("task") is not None
               for part in manifest.get("parts") or ())


def uses_gpu(manifest):
    """Whether the manifest's providers include a GPU one (CUDA, TensorRT)."""
    return any(isinstance(p, dict) and p.get("name") in GPU_PROVIDERS
               for p in manifest.get("providers") or ())


def runner_files(manifest, extras=EXTRAS):
    """The runner files a bundle with *manifest* ships, sorted: the core, the heads of its
    parts' tasks, the GPU's facts where a GPU provider is listed, image decoding where a part
    takes images, the *extras* asked for, and the cascade's modules when it has a pipeline."""
    files = set(RUNNER_CORE) | (set(RUNNER_GPU) if uses_gpu(manifest) else set())
    if any(isinstance(p, dict) and p.get("preprocess") for p in manifest.get("parts") or ()):
        files.update(RUNNER_IMAGES)
    if has_tasks(manifest):
        files.update(RUNNER_TASKS)
    files.update(RUNNER_HEADS[kind] for kind in part_kinds(manifest))
    for extra in with_needs(extras):
        files.update(RUNNER_EXTRAS[extra])
    if manifest.get("pipeline"):
        files.update(RUNNER_CASCADE)
    return tuple(sorted(files, key=lambda rel: (rel != RUNNER_FILE, rel)))


def with_needs(extras):
    """*extras* with those they answer through (serve: infer's inputs and answers), in EXTRAS'
    order."""
    wanted = set(extras) | set(sum((NEEDS.get(extra, ()) for extra in extras), ()))
    return tuple(extra for extra in EXTRAS if extra in wanted)


def runner_needed(manifest):
    """The runner files a bundle's file table must list: the entry modules, and the cascade's
    when its manifest has a pipeline (bundles of every edgepack since the split shipped them)."""
    return RUNNER_ENTRY + (CASCADE_NEEDED if manifest.get("pipeline") else ())


def wants_pipeline(manifest, args):
    """Whether `infer`/`serve` run the bundle's pipeline: it has one and neither --part nor
    --raw asks for one part's tensors."""
    return bool(manifest.get("pipeline")) and getattr(args, "part", None) is None and \
        not getattr(args, "raw", False)


def optional_module(name):
    """The runner's module *name* that a bundle ships only when its manifest uses it; a
    BundleError (exit 2) when this bundle's runner lacks it."""
    full = "%s.%s" % (__package__, name)
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as exc:
        if exc.name != full:
            raise
        raise BundleError("%s/%s.py: missing, and this bundle's manifest needs it (copy the "
                          "bundle again, or build it again)" % (RUNNER_DIR, name)) from None


def shipped(manifest, rel):
    """Whether the bundle's file table lists *rel* (a runner file), or its runner predates the
    file table's listing of runner/ (then it shipped everything)."""
    files = manifest.get("files") or {}
    return rel in files or not any(f.startswith(RUNNER_DIR + "/") for f in files)


def extra_module(name, manifest):
    """The module *name* of one of the runner's extras (EXTRAS): a BundleError
    (exit 2) saying how to get it when the bundle was built without it."""
    extra = EXTRA_OF.get(name, name)
    if not shipped(manifest, "%s/%s.py" % (RUNNER_DIR, name)):
        raise BundleError("this bundle was built without `%s` (edgepack build --runner-extras); "
                          "build it again with --runner-extras %s (the default)"
                          % (extra, ",".join(EXTRAS)))
    return optional_module(name)


def runner_package(manifest, bundle=None):
    """Whether the bundle's runner is run.py plus the runner/ package: its file table lists a
    runner/ file, or *bundle* has a runner/ folder. A bundle built before the runner was split
    into a package holds the whole runner in run.py alone."""
    files = manifest.get("files") or {}
    return any(rel.startswith(RUNNER_DIR + "/") for rel in files) or (
        bundle is not None and os.path.isdir(os.path.join(bundle, RUNNER_DIR)))
