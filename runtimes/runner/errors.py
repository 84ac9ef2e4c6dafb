"""Exit codes and the errors the runner turns into them: one line on stderr, no traceback; the
image inputs' kinds and pixel limit that infer, serve, bench and the cascade share."""


EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INTERRUPTED = 130   # Ctrl-C, as shells and `edgepack build` report it
EXIT_BUG = 3             # an unexpected exception: a bug, as in `edgepack`
EXIT_BROKEN_PIPE = 141   # stdout's reader left early (| head): 128 + SIGPIPE, as a shell says


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")   # files read as images
# A 1 MB PNG can decode to 20000x20000 (1.2 GB): images are measured from their header first.
MAX_PIXELS = 50 * 1000 * 1000


class BundleError(Exception):
    """The bundle or the command line is unusable (exit 2); in `serve`, a bad request (400)."""

    status = 400


class TooLarge(BundleError):
    """An input over a size limit (exit 2; in `serve`, 413)."""

    status = 413


class ProviderMissing(Exception):
    """--require-provider named a provider that did not start (exit 1)."""


def one_line(exc):
    text = " ".join(str(exc).split())
    return (text[:300] + "...") if len(text) > 300 else text or type(exc).__name__
