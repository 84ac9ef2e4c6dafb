"""The edgepack runner: what `python3 run.py check|bench|infer|serve` runs inside a bundle.

Python 3.8+, the standard library, numpy and onnxruntime only (OpenCV only for image inputs);
never imports the packager, which imports these same modules for preprocessing and sessions.
The core, in every bundle (each module imports only those listed before it):

    errors     exit codes, BundleError and the one-line messages; image inputs' limits
    contents   the runner's files by group; the optional modules loaded on demand
    places     provider options that name a place stay in the bundle; regular files
    metrics    output agreement (ragged outputs too), timed runs, latency statistics
    manifest   manifest.json, its shape, file hashes, integrity, golden data
    facts      the device: CPU, power mode, memory        load   how busy the machine is
    sessions   session options, providers and their graphs, opening a session
    check      `check`          bench    `bench`          report  the human-readable report
    cli        the command line: arguments, the command run, errors as exit codes

Everything else ships where the bundle uses it (contents.py says when): the tasks' heads and
judgement, image decoding, the GPU's facts and TensorRT caches, the cascade, and the extras a
build asks for (infer, serve, tune, profile, roofline).
"""
