"""What a level is, declared once: the harness and the tests read it and never probe."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Facts:
    """One rung's facts (docs/conventions.md, "Levels").

    ``array``: ``"python"``, ``"numpy"`` or ``"torch"``, the native array type;
    ``gradients``: None, ``"hand-written"`` or ``"autograd"``; ``interpreted``:
    whether the kernels run in an emulator (Triton's interpreter); ``dtypes``:
    the float dtypes it computes in, most precise first; ``devices``: where it
    runs; ``description``: one line on what computes.
    """

    array: str
    gradients: str | None
    interpreted: bool
    dtypes: tuple[str, ...]
    devices: tuple[str, ...]
    description: str

    def describe(self, *, device=None, dtype=None) -> str:
        """One line saying what computes (a level may say more, for a device and dtype)."""
        return self.description
