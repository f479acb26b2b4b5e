"""Quantities as people read them, shared by the engine's findings and the reports (which
may not import the engine)."""

from __future__ import annotations

MIB = 1024 * 1024


def format_bytes(nbytes: int) -> str:
    """Bytes as people read them: 512 B, 24.0 KiB, 23.80 MiB, 64.00 GiB."""
    if nbytes < 1024:
        return f"{nbytes} B"
    if nbytes < MIB:
        return f"{nbytes / 1024:.1f} KiB"
    if nbytes < 1024 * MIB:
        return f"{nbytes / MIB:.2f} MiB"
    return f"{nbytes / (1024 * MIB):.2f} GiB"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 finding`, `3 findings`, `0 pallas_calls`: every count the reports print, in one
    wording (`nouns`: the plural where it is not `noun` + "s")."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


def findings_in_calls(findings: int, calls: int) -> str:
    """`2 findings in 1 pallas_call`: the summary every command, report and API repeats."""
    return f"{plural(findings, 'finding')} in {plural(calls, 'pallas_call')}"
