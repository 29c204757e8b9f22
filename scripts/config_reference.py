"""Print the config reference (every group and key, with type, default and meaning) as Markdown.

    python scripts/config_reference.py > /tmp/ref.md     # the "Config reference" of docs/configuration.md

Read from ``orchestrator/config/schema.py``: the dataclass fields and their trailing comments.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import re

from omegaconf import MISSING

from orchestrator.core import choices
from orchestrator.config import schema as c
GROUP_OPTIONS_NOTE = "options: the files in `conf/<group>/`"


def field_comments(cls) -> dict[str, str]:
    comments, lines = {}, inspect.getsource(cls).splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s+(\w+): [^#]*?(?:# (.*))?$", line)
        if m and m.group(1) in {f.name for f in dataclasses.fields(cls)}:
            comments[m.group(1)] = (m.group(2) or "").replace("|", "\\|")
    return comments


def type_of(f) -> str:
    """The field's type as the reference writes it: a choice (an ``Enum`` of ``orchestrator.core.choices``) as ``choice``."""
    typ = str(f.type)
    typ = (typ[len("Optional["):-1] + " or null") if typ.startswith("Optional[") else typ
    return "choice" if isinstance(getattr(choices, typ, None), enum.EnumMeta) else typ


def default_of(f) -> str:
    if f.default is not dataclasses.MISSING:
        if isinstance(f.default, enum.Enum):
            return repr(f.default.value)
        return "required" if f.default == MISSING else repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return ""


def main() -> None:
    print("| key | type | default | meaning |\n|---|---|---|---|")
    for group_field in dataclasses.fields(c.Config):
        cls = group_field.default_factory
        comments = field_comments(cls)
        for f in dataclasses.fields(cls):
            row = f"| `{group_field.name}.{f.name}` | {type_of(f)} | `{default_of(f)}` | {comments.get(f.name, '')} |"
            print(row)
            if f.type == "list[MixSourceConfig]":  # the keys of each entry
                entry = field_comments(c.MixSourceConfig)
                for g in dataclasses.fields(c.MixSourceConfig):
                    print(f"| `{group_field.name}.{f.name}[].{g.name}` | {type_of(g)} | `{default_of(g)}` | "
                          f"{entry.get(g.name, '')} |")
        if group_field.name == "recipe":  # keys only one recipe has
            for name, schema in c.RECIPE_SCHEMAS.items():
                comments = field_comments(schema)
                own = [f for f in dataclasses.fields(schema) if f.name not in {g.name for g in dataclasses.fields(cls)}]
                for f in own:
                    print(f"| `recipe.{f.name}` (recipe={name} only) | {type_of(f)} | `{default_of(f)}` | "
                          f"{comments.get(f.name, '')} |")


if __name__ == "__main__":
    main()
