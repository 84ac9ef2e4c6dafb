"""Errors the packager raises; the CLI turns each into one line and a non-zero exit."""


class PackagerError(Exception):
    """A problem the user can fix: what went wrong, and the fix."""

    exit_code = 2

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


class ModelError(PackagerError):
    """The model file is missing, corrupt or not ONNX."""


class SpecError(PackagerError):
    """A --input / --dynamic / --part / --factory-arg value is malformed."""


class ExportError(PackagerError):
    """A PyTorch model cannot be loaded, exported, or its export disagrees with PyTorch."""


class ExportInvalid(ExportError):
    """The export ran, but its outputs hold NaN or infinity: validation failed (as a build that
    misses its accuracy budget), not malformed input."""

    exit_code = 1


class ShapeError(PackagerError):
    """Shapes cannot be made static."""


class CalibrationError(PackagerError):
    """Calibration data is missing, unreadable or does not fit the model."""


class PreprocessError(PackagerError):
    """A preprocessing spec is malformed or does not fit the model input."""


class QuantizationError(PackagerError):
    """The quantizer failed or produced a model that does not run."""


class TargetError(PackagerError):
    """A target profile is unknown or invalid."""


class BundleError(PackagerError):
    """A bundle cannot be written or read."""


class VerifyError(PackagerError):
    """The bundle could not be verified (broken bundle, runner crashed)."""


class CheckFailed(PackagerError):
    """Verification ran and a check failed: accuracy, integrity or a latency budget."""

    exit_code = 1


class BudgetMissed(PackagerError):
    """A forced precision cannot keep the accuracy budget: the bundle would break its promise."""

    exit_code = 1
