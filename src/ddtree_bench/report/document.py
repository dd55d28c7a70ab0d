"""The blocks a report page is made of. A section holds blocks and sections; the Markdown and the HTML
writer (``render``) each walk the same tree. Text may hold ``**bold**`` and ```code``` spans."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass
class Text:
    text: str
    style: str = "plain"  # plain | note | em


@dataclass
class Bullets:
    items: list[str]
    ordered: bool = False


@dataclass
class Table:
    frame: pd.DataFrame
    collapsed: bool = False
    summary: str | None = None  # the collapsed table's summary line (default: its row count)
    status_column: str | None = None  # cells coloured by status (met / not met / no data)
    empty: str = "(none)"  # what stands for an empty table


@dataclass
class Figure:
    name: str
    title: str
    caption: str
    path: Path
    collapsed: bool = False


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)

    def add(self, *blocks) -> Section:
        self.blocks.extend(b for b in blocks if b is not None)
        return self

    def walk(self):
        """Every block below this section, depth first."""
        for block in self.blocks:
            yield block
            if isinstance(block, Section):
                yield from block.walk()
