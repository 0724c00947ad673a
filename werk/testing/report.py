"""What the conformance kit found: one line per check, failures and warnings."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Check", "ConformanceError", "ConformanceReport"]


@dataclass(frozen=True)
class Check:
    """One check's outcome.

    :ivar passed: ``True`` passed, ``False`` failed, ``None`` not run (``detail`` says why).
    :ivar warning: something the plugin should know that is not a failure (a row the host
        lowered); ``passed`` is then ``None``. ``--strict`` turns warnings into failures.
    """

    name: str
    passed: bool | None
    detail: str = ""
    warning: bool = False

    def line(self) -> str:
        mark = "WARN" if self.warning else {True: "PASS", False: "FAIL", None: "SKIP"}[self.passed]
        return f"{mark}  {self.name}" + (f": {self.detail}" if self.detail else "")


class ConformanceError(AssertionError):
    """Raised by :meth:`ConformanceReport.raise_for_failures`; the message lists every failure."""


@dataclass
class ConformanceReport:
    """What :func:`werk.testing.conformance` found for one backend."""

    backend: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.warning]

    @property
    def ok(self) -> bool:
        """No check failed (warnings allowed)."""
        return not self.failures

    def ok_strictly(self) -> bool:
        """No check failed and nothing was warned about (``--strict``)."""
        return self.ok and not self.warnings

    def passed(self, name: str) -> bool:
        return any(c.name == name and c.passed for c in self.checks)

    def add(self, name: str, passed: bool | None, detail: str = "") -> bool:
        self.checks.append(Check(name, passed, detail))
        return bool(passed)

    def warn(self, name: str, detail: str) -> None:
        self.checks.append(Check(name, None, detail, warning=True))

    def summary(self) -> str:
        lines = [f"werk.testing: backend {self.backend!r}"]
        lines += ["  " + c.line() for c in self.checks]
        failed, warned = len(self.failures), len(self.warnings)
        passed = sum(1 for c in self.checks if c.passed)
        tail = f"  {passed} passed, {failed} failed"
        if warned:
            tail += f", {warned} warning{'s' if warned != 1 else ''}"
        lines.append(tail)
        return "\n".join(lines)

    def raise_for_failures(self, *, strict: bool = False) -> None:
        """Raise :class:`ConformanceError` with the whole report when a check failed (or, with
        ``strict``, when there is a warning)."""
        if not (self.ok_strictly() if strict else self.ok):
            raise ConformanceError(self.summary())
