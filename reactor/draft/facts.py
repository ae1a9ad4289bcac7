"""What the catalog says about the app's tables, as plain values: the input of the drafting.

:mod:`reactor.draft.catalog` reads them from PostgreSQL; tests build them by hand. Nothing here
connects to a database.
"""

from __future__ import annotations

from dataclasses import dataclass

# The types a status column may have: text, varchar, an enum (``enum`` set) or an integer.
TEXT_TYPES = ("text", "character varying")
INTEGER_TYPES = ("smallint", "integer", "bigint")
TIME_TYPES = ("timestamp with time zone", "timestamp without time zone")
NAIVE = "timestamp without time zone"


@dataclass(frozen=True)
class ColumnFacts:
    """One column of a table."""

    name: str
    type: str  # format_type() without modifiers: varchar(20) is character varying
    not_null: bool = False
    filled: bool = False  # has a default, or is an identity or generated column
    enum: bool = False
    labels: tuple[str, ...] = ()  # the enum's labels, in their order
    # The constants of the CHECK constraints on this column alone, in their order: the values
    # a row may hold when the check is a list of them (status IN (...)). Empty without one.
    checked: tuple[str | int, ...] = ()

    @property
    def naive(self) -> bool:
        return self.type == NAIVE

    @property
    def values(self) -> tuple[str | int, ...]:
        """The values the column says it can hold: its enum's labels, else its CHECK's."""
        return self.labels or self.checked


@dataclass(frozen=True)
class ForeignKey:
    """A foreign key of one column to one column of another table."""

    column: str
    target: tuple[str, str]  # (schema, table)
    target_column: str


@dataclass(frozen=True)
class TableFacts:
    """One table (plain or partitioned) with what the drafting reads of it."""

    schema: str
    name: str
    columns: tuple[ColumnFacts, ...]
    primary_key: tuple[str, ...] = ()
    # The columns that are unique alone: a one-column primary key or unique index (valid,
    # without a predicate or an expression), which ON CONFLICT can name.
    unique: frozenset[str] = frozenset()
    foreign_keys: tuple[ForeignKey, ...] = ()
    partitioned: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.schema, self.name)

    @property
    def shown(self) -> str:
        """As messages and the mapping file name it: unqualified in public."""
        return self.name if self.schema == "public" else f"{self.schema}.{self.name}"

    def column(self, name: str) -> ColumnFacts | None:
        return next((c for c in self.columns if c.name == name), None)

    def references(self, target: TableFacts) -> list[ForeignKey]:
        """This table's foreign keys to ``target``."""
        return [fk for fk in self.foreign_keys if fk.target == target.key]
