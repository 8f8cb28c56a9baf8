"""The per-domain verifier set of pivot.yaml's `verifier:` section."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Iterable

from pivot_assets.core.ids import canonical_json, short_hash

from .base import Score, Verifier
from .registry import build_verifier

if TYPE_CHECKING:
    from pivot_assets.core.config import VerifierSection

DEFAULT_SECTION = {"default": {"name": "tool_call"}, "domains": {}}


class VerifierSpecError(ValueError):
    """A verifier spec that does not build; `part` names it in its section ("default", "domains.swe")."""

    def __init__(self, part: str, message: str) -> None:
        super().__init__(message)
        self.part = part


class DomainVerifiers:
    """A verifier section of pivot.yaml (`verifier:` and its shape's siblings): a default verifier and optional
    per-domain ones. Takes the typed section or its dict; verifiers/sets.py builds a config's sets once."""

    def __init__(self, verifier_section: "VerifierSection | dict | None" = None) -> None:
        section = verifier_section if verifier_section is not None else DEFAULT_SECTION
        if hasattr(section, "model_dump"):
            section = section.model_dump()
        if not isinstance(section, dict):
            raise ValueError(f"verifier section must be a mapping, got {type(section).__name__}")
        unknown = set(section) - {"default", "domains"}
        if unknown:
            raise ValueError(f"verifier section: unknown key {sorted(unknown)[0]!r} (known: default, domains)")
        domains = section.get("domains") or {}
        if not isinstance(domains, dict):
            raise ValueError("verifier section: 'domains' must map domain names to verifier specs")
        try:
            self.default = build_verifier(section.get("default") or {"name": "tool_call"})
        except ValueError as e:
            raise VerifierSpecError("default", str(e)) from None
        self.domains: dict[str, Verifier] = {}
        for domain, spec in domains.items():
            try:
                self.domains[str(domain)] = build_verifier(spec)
            except ValueError as e:
                raise VerifierSpecError(f"domains.{domain}", f"verifier section, domain {domain!r}: {e}") from None

    def for_domain(self, domain: str | None) -> Verifier:
        """The domain's verifier, or the default for an unknown / missing domain."""
        return self.domains.get(domain, self.default) if domain is not None else self.default

    @property
    def pass_thresholds(self) -> dict[str | None, float]:
        """Each listed domain's pass threshold (Verifier.pass_threshold), and under None the default verifier's,
        which every other domain uses: what turn_profiles counts n_pass by."""
        return {None: self.default.pass_threshold, **{d: v.pass_threshold for d, v in self.domains.items()}}

    @property
    def fingerprints(self) -> dict[str, str]:
        return {"default": self.default.fingerprint, **{f"domain:{d}": v.fingerprint for d, v in self.domains.items()}}

    @property
    def fingerprint(self) -> str:
        """Hash over every verifier of the section (config and code): any change re-scores everything."""
        return short_hash(canonical_json(self.fingerprints))

    def score_rows(self, rows: Iterable[dict]) -> list[Score]:
        """Score rows (domain, expected_action, candidate, tools, state), grouped by domain, results in order."""
        rows = list(rows)
        groups: dict[Any, list[int]] = defaultdict(list)
        for i, row in enumerate(rows):
            groups[row.get("domain")].append(i)
        out: list[Score | None] = [None] * len(rows)
        for domain, idx in groups.items():
            scores = self.for_domain(domain).score_many([rows[i] for i in idx])
            for i, s in zip(idx, scores):
                out[i] = s
        return out  # type: ignore[return-value]
