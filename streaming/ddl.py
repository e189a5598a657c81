"""Spark DDL type strings → pyspark DataTypes, parsed in Python (no JVM: an app loads before Spark starts).

``DataType.fromDDL`` asks a running Spark session; an owner-side field's declared type must be checked when
the app loads, and typed where no session runs (printing the schema, the schema tests). The grammar is the
part of Spark's that types values::

    type    := boolean | tinyint | byte | smallint | short | int | integer | bigint | long | float | real
             | double | string | binary | date | timestamp | timestamp_ltz | timestamp_ntz
             | decimal[(p[, s])] | dec[…] | numeric[…] | char(n) | varchar(n)
             | array<type> | map<type, type> | struct<fields>
    fields  := name[:] type [NOT NULL] [COMMENT 'text'] [, fields]

Keywords are case-insensitive, a name may be back-quoted, and a top-level field list is a struct
(``"genre STRING, plays BIGINT"``), as in Spark.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructField

_TOKEN = re.compile(r"\s*(?:`((?:[^`]|``)*)`|([A-Za-z_][A-Za-z0-9_]*)|(-?\d+)|'((?:[^'\\]|\\.)*)'|(\S))")
_SIMPLE = {
    "boolean": "BooleanType",
    "tinyint": "ByteType",
    "byte": "ByteType",
    "smallint": "ShortType",
    "short": "ShortType",
    "int": "IntegerType",
    "integer": "IntegerType",
    "bigint": "LongType",
    "long": "LongType",
    "float": "FloatType",
    "real": "FloatType",
    "double": "DoubleType",
    "string": "StringType",
    "binary": "BinaryType",
    "date": "DateType",
    "timestamp": "TimestampType",
    "timestamp_ltz": "TimestampType",
    "timestamp_ntz": "TimestampNTZType",
}


class DDLError(ValueError):
    """A type string this grammar does not parse; the message says where."""


def _tokens(text: str) -> list[tuple[str, str]]:
    """Return (kind, text) tokens: name (quoted or not), number, string, punct."""
    found: list[tuple[str, str]] = []
    for quoted, word, number, string, punct in _TOKEN.findall(text):
        if quoted:
            found.append(("name", quoted.replace("``", "`")))
        elif word:
            found.append(("word", word))
        elif number:
            found.append(("number", number))
        elif punct:
            found.append(("punct", punct))
        else:
            found.append(("string", string))
    return found


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.at = 0

    def fail(self, expected: str) -> DDLError:
        got = self.tokens[self.at][1] if self.at < len(self.tokens) else "the end"
        return DDLError(f"type {self.text!r}: expected {expected} at {got!r}")

    def peek(self, value: str) -> bool:
        return self.at < len(self.tokens) and self.tokens[self.at][1].lower() == value

    def take(self, kind: str, value: str | None = None, label: str | None = None) -> str:
        if self.at >= len(self.tokens):
            raise self.fail(label or value or kind)
        token_kind, text = self.tokens[self.at]
        if token_kind not in kind.split("|") or (value and text.lower() != value):
            raise self.fail(label or value or kind)
        self.at += 1
        return text

    def data_type(self) -> DataType:
        from pyspark.sql import types

        word = self.take("word", label="a type").lower()
        if word in ("array", "map", "struct"):
            self.take("punct", "<")
            if word == "array":
                found: DataType = types.ArrayType(self.data_type(), True)
            elif word == "map":
                key = self.data_type()
                self.take("punct", ",")
                found = types.MapType(key, self.data_type(), True)
            else:
                found = types.StructType([] if self.peek(">") else self.fields())
            self.take("punct", ">")
            return found
        if word in ("decimal", "dec", "numeric"):
            precision, scale = 10, 0
            if self.peek("("):
                self.take("punct", "(")
                precision = int(self.take("number", label="a number"))
                if self.peek(","):
                    self.take("punct", ",")
                    scale = int(self.take("number", label="a number"))
                self.take("punct", ")")
            return types.DecimalType(precision, scale)
        if word in ("char", "varchar"):
            self.take("punct", "(")
            length = int(self.take("number", label="a number"))
            self.take("punct", ")")
            return types.CharType(length) if word == "char" else types.VarcharType(length)
        if word not in _SIMPLE:
            self.at -= 1
            raise self.fail(f"a type ({', '.join(_SIMPLE)}, decimal, char, varchar, array, map, struct)")
        simple: DataType = getattr(types, _SIMPLE[word])()
        return simple

    def fields(self) -> list[StructField]:
        from pyspark.sql.types import StructField

        found = []
        while True:
            name = self.take("name|word", label="a field name")
            if self.peek(":"):
                self.take("punct", ":")
            data_type = self.data_type()
            nullable, metadata = True, {}
            if self.peek("not"):
                self.take("word", "not")
                self.take("word", "null")
                nullable = False
            if self.peek("comment"):
                self.take("word", "comment")
                metadata["comment"] = self.take("string", label="a quoted comment")
            found.append(StructField(name, data_type, nullable, metadata))
            if not self.peek(","):
                return found
            self.take("punct", ",")

    def end(self) -> None:
        if self.at != len(self.tokens):
            raise self.fail("the end")


def parse_ddl(text: str) -> DataType:
    """Return the DataType a Spark DDL type string names; DDLError (one line) if it names none."""
    from pyspark.sql.types import StructType

    parser = _Parser(text)
    try:
        found = parser.data_type()
        parser.end()
        return found
    except DDLError as first:
        fields = _Parser(text)  # "genre STRING, plays BIGINT": a struct's fields without struct<…>
        try:
            struct = StructType(fields.fields())
            fields.end()
        except DDLError:
            raise first from None
        return struct
