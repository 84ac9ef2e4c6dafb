"""The edgepack runner: what `python3 run.py check|bench|infer|serve` runs inside a bundle.

Python 3.8+, the standard library, numpy and onnxruntime only (OpenCV only for image inputs);
never imports the packager, which imports these same modules for preprocessing and sessions.
Modules, each importing only those listed before it:

    errors     exit codes, BundleError and the one-line messages
    task_spec  a part's task: kinds, parameters, defaults, checked against the outputs
    tasks      task heads: top-k labels, boxes + NMS, embeddings, CTC text, masks, speech
    images     image headers, decoding, preprocessing
    manifest   manifest.json, its shape, file hashes, integrity, golden data
    facts      the device: CPU, power mode, GPU, CUDA, cuDNN, TensorRT, memory
    metrics    output agreement, timed runs, latency statistics
    sessions   session options, providers and their graphs, TensorRT caches, opening a session
    inputs     files and HTTP bodies as checked model inputs; outputs described
    task_figures  two models' agreement in a task's terms, and its judgement
    check      `check`          tuning   `bench --tune`      bench   `bench`
    infer      `infer`          serve    `serve`             report  the human-readable report
    cli        the command line: arguments, the command run, errors as exit codes
"""
