"""`run.py infer`: the model run on image, .npy and .npz files."""

import os

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import BundleError, one_line
from .inputs import describe_outputs, input_files, load_input_file
from .manifest import one_part, require_intact
from .sessions import open_session


def cmd_infer(bundle, manifest, args):
    require_intact(bundle, manifest)
    part = one_part(manifest, args.part)
    files = input_files(args.files, part)
    session, _ = open_session(bundle, manifest, part, args)
    names = [o.name for o in session.get_outputs()]
    results, arrays = [], {}
    max_pixels = args.max_megapixels * 1e6
    for path in files:
        feed = load_input_file(path, part, max_pixels)
        try:
            outputs = session.run(names, feed)
        except Exception as exc:  # e.g. a token id past the vocabulary: the input's fault
            raise BundleError("%s: onnxruntime refused it: %s" % (path, one_line(exc))) from None
        for name, value in zip(names, outputs):
            arrays["%s/%s" % (os.path.basename(path), name)] = value
        results.append({"file": path, "outputs": describe_outputs(
            names, outputs, part.get("labels"), args.top)})
    if args.out:
        np.savez(args.out, **arrays)
    return {"results": results, "providers": session.get_providers(), "passed": True}
