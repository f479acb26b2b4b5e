"""Reading back a file pallas-check wrote (a baseline, a JSON report): its `schema` and
`schema_version` are checked first, so that a file of another kind or another version is
a one-line error naming it, not data silently misread (`"1"` or `true` are not `1`)."""

from __future__ import annotations

from pallas_check.config.errors import SchemaError as SchemaError  # raised here, caught by importers


def check_schema(data: object, path: object, schema: str, versions: tuple[int, ...],
                 what: str, unversioned: int | None = None) -> None:
    """Raise SchemaError unless `data` is a JSON object of `schema` at one of `versions`
    (`unversioned`: the version a file without `schema_version` is read as, if any)."""
    shown = ", ".join(str(v) for v in versions)
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise SchemaError(f"{path} is not a pallas-check {what} (schema {schema!r})")
    version = data.get("schema_version", unversioned)
    # bool is an int in Python; a JSON `true` is no version number.
    if type(version) is not int or version not in versions:
        found = ("has no schema_version" if "schema_version" not in data
                 else f"schema_version {version!r} is not supported")
        raise SchemaError(f"{path}: {what} {found}; this pallas-check reads"
                          f" schema_version {shown}")
