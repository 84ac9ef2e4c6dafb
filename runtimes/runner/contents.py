"""What a bundle's runner holds: its files by group, the ones a bundle's table must list, and
the modules a bundle ships only when its manifest uses them, loaded on demand.

    RUNNER_CORE          run.py and the package's modules every bundle ships
    RUNNER_CASCADE       the cascade's modules: only a bundle with a `pipeline` ships them
    runner_files(m)      what a bundle with manifest *m* ships (the build's list)
    runner_needed(m)     what its file table must list, whichever edgepack built it
    optional_module(n)   a group's module, or one line (exit 2) saying the bundle lacks it
"""

import importlib
import os

from .errors import BundleError

RUNNER_FILE = "run.py"
RUNNER_DIR = "runner"
# The runner's files, each hashed in the manifest: the entry script and its package's core, which
# every bundle ships, and the modules a bundle ships only when its manifest uses them (the
# cascade: a `pipeline` section). run.py's RUNNER_MODULES and OPTIONAL_MODULES name the same.
RUNNER_CORE = ("run.py", "runner/__init__.py", "runner/bench.py", "runner/check.py",
               "runner/cli.py", "runner/closing.py", "runner/contents.py", "runner/errors.py",
               "runner/facts.py", "runner/images.py", "runner/infer.py", "runner/inputs.py",
               "runner/load.py", "runner/manifest.py", "runner/metrics.py", "runner/places.py",
               "runner/profile.py", "runner/report.py", "runner/serve.py", "runner/serve_http.py",
               "runner/sessions.py", "runner/task_figures.py", "runner/task_spec.py",
               "runner/tasks.py", "runner/tuning.py")
RUNNER_CASCADE = ("runner/cascade.py", "runner/cascade_face.py", "runner/cascade_judge.py",
                  "runner/cascade_ocr.py", "runner/cascade_spec.py")
RUNNER_FILES = RUNNER_CORE + RUNNER_CASCADE   # every file a bundle's runner may hold


# What any bundle's runner package holds, whichever edgepack built it: its entry modules. The
# rest of a bundle's runner is what its file table lists (a module added later is not asked of
# a bundle built before it; the bundle's own run.py refuses a runner/ that lacks one of its own).
RUNNER_ENTRY = ("run.py", "runner/__init__.py", "runner/cli.py", "runner/manifest.py")


def runner_files(manifest):
    """The runner files a bundle with *manifest* ships: the core, and the cascade's modules
    when it runs its parts as one pipeline."""
    return RUNNER_CORE + (RUNNER_CASCADE if manifest.get("pipeline") else ())


def runner_needed(manifest):
    """The runner files a bundle's file table must list: the entry modules, and the cascade's
    when its manifest has a pipeline (bundles of every edgepack since the split shipped them)."""
    return RUNNER_ENTRY + (RUNNER_CASCADE if manifest.get("pipeline") else ())


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


def runner_package(manifest, bundle=None):
    """Whether the bundle's runner is run.py plus the runner/ package: its file table lists a
    runner/ file, or *bundle* has a runner/ folder. A bundle built before the runner was split
    into a package holds the whole runner in run.py alone."""
    files = manifest.get("files") or {}
    return any(rel.startswith(RUNNER_DIR + "/") for rel in files) or (
        bundle is not None and os.path.isdir(os.path.join(bundle, RUNNER_DIR)))
