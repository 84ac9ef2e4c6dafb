"""What a build asks of quantization, typed: the user's choices over the target's preset.

    QuantRequest(precision="int8", exclude=("head/Conv",))   --precision, --mode, --exclude...
    QuantRequest.of({"precision": "int8"})                    from a mapping (library callers)
    request.over(base)                                        a part's choices over the build's
    request.config_fields()                                   what QuantConfig.from_preset takes
    request.pinned()                                          the fields the search may not move
"""

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Union

from ..errors import SpecError


@dataclass(frozen=True)
class QuantRequest:
    """Each field None (or an empty exclude) leaves the target's preset to decide; *precision*
    forces one (missing the budget is then an error), the others pin that field of the
    search; *search_seconds* bounds the search (not a config field)."""

    precision: str | None = None          # int8, fp16, fp32 or auto
    mode: str | None = None               # static, dynamic
    format: str | None = None             # qdq, qoperator
    activation_type: str | None = None
    weight_type: str | None = None
    per_channel: bool | None = None
    reduce_range: bool | None = None
    calibration_method: str | None = None
    exclude: tuple[str, ...] = ()         # node names kept FP32
    search_seconds: float | None = None
    why: str | None = None                # why *precision* is forced, where not the user's
                                          # choice (a pipeline's end-to-end judge)

    @classmethod
    def of(cls, value: Union["QuantRequest", Mapping[str, Any], None]) -> "QuantRequest":
        """*value* as a request: a request as it is, a mapping by its keys (an unknown key is
        refused, naming it), None as the empty request."""
        if isinstance(value, QuantRequest):
            return value
        given = dict(value or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise SpecError(f"quant: {unknown[0]!r} is not a quantization option",
                            f"use {', '.join(known)}")
        given["exclude"] = tuple(given.get("exclude") or ())
        return cls(**given)

    def given(self) -> dict[str, Any]:
        """The fields chosen (not None, a non-empty exclude)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) not in (None, ())}

    def over(self, base: "QuantRequest") -> "QuantRequest":
        """This request's choices over *base*'s (a part's --part-precision over the build's)."""
        return replace(base, **self.given())

    def config_fields(self) -> dict[str, Any]:
        """The chosen fields a QuantConfig has (all but precision and the search's limit)."""
        return {k: v for k, v in self.given().items() if k not in ("precision", "search_seconds",
                                                                   "why")}

    def pinned(self) -> set[str]:
        """The config fields the user fixed: the search does not vary them."""
        return set(self.config_fields())
