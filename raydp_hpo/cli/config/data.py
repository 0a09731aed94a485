"""``data:`` of an experiment file: where the private dataset comes from and how it is split
(all splits are private), a union discriminated by ``data.source``.

The models also answer what the run needs of them: the public split sizes
(:meth:`_DataBase.public_sizes`), the fractions split off the source
(:meth:`_DataBase.split_fractions`) and the identity the budget belongs to
(:meth:`_DataBase.fingerprint`, :meth:`_DataBase.ledger_name`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from raydp_hpo.cli.config._base import (
    Bool,
    Fraction,
    Int,
    PositiveInt,
    Strict,
    Text,
    fail,
    integer,
)
from raydp_hpo.trainables.data import canonical_uri

__all__ = ["DataModel", "Mnist1dData", "DigitsData", "ParquetData", "DATA_MODELS",
           "DATA_SOURCES", "COMMON_DATA_KEYS"]

DATA_SOURCES = ("mnist1d", "digits", "parquet")
#: Public sizes of the built-in datasets (records before the split; MNIST-1D: its default).
_DIGITS_SIZE = 1797
_MNIST1D_SIZE = 5000

_SIZE_HELP = ("PUBLIC size used by the accounting and normalisers; default: from the source's "
              "public size for built-ins; parquet: required unless data.sizes_public: true")


class _DataBase(Strict):
    val_fraction: Fraction = Field(0.1, description="share of the records for validation")
    test_fraction: Fraction = Field(0.1, description="share of the records for testing")
    declared_train_size: PositiveInt | None = Field(None, description=_SIZE_HELP)
    declared_validation_size: PositiveInt | None = Field(None, description=_SIZE_HELP)
    declared_test_size: PositiveInt | None = Field(
        None, description=_SIZE_HELP + " (read with test_accuracy_epsilon only)")

    @model_validator(mode="after")
    def _fractions(self) -> _DataBase:
        if self.val_fraction + self.test_fraction >= 1.0:
            fail("{path}.val_fraction + {path}.test_fraction must be < 1, got "
                 f"{self.val_fraction:g} + {self.test_fraction:g}")
        return self

    # ---- what the run reads off the validated data block

    def split_fractions(self) -> tuple[float, float]:
        """The (validation, test) shares split off the source (Parquet: 0 for a split read
        from its own file, :meth:`ParquetData._split_files`)."""
        return self.val_fraction, self.test_fraction

    def public_total(self) -> int | None:
        """Records of a built-in source before the split (public); ``None`` for Parquet."""
        return None

    def _split_sizes(self) -> Any:
        """:func:`raydp_hpo.trainables.data.public_split_sizes` of the public total, or
        ``None`` (Parquet: its size is private)."""
        from raydp_hpo.trainables.data import public_split_sizes

        total = self.public_total()
        return None if total is None else public_split_sizes(total, *self.split_fractions())

    def public_sizes(self) -> tuple[int | None, int | None]:
        """Declared public (training, validation) sizes. Built-in sources have a public total
        N: ``round(N·(1 − f_val − f_test))`` and ``round(N·f_val)`` unless declared
        (:func:`~raydp_hpo.trainables.data.public_split_sizes`, as ``split()`` declares them).
        Parquet: only what is declared (``None``: refused at validation unless
        ``sizes_public``, when the realised sizes are listed as treated as public)."""
        sizes = self._split_sizes()
        train, val = self.declared_train_size, self.declared_validation_size
        if sizes is not None:
            train = sizes.train if train is None else train
            val = sizes.validation if val is None else val
        return train, val

    def public_test_size(self) -> int | None:
        """Declared public test size: ``declared_test_size``, else ``round(N·f_test)`` for
        built-in sources, else ``None``."""
        if self.declared_test_size is not None:
            return self.declared_test_size
        sizes = self._split_sizes()
        return None if sizes is None else sizes.test

    def fingerprint(self) -> str:
        """The identity of the data source the budget belongs to: the built-in dataset and its
        generator settings, or the canonical URI of the Parquet data. Deliberately not a hash
        of the content: a dataset with one record more is a neighbouring dataset of the same
        people and must spend from the same budget. The same string the Python loaders put
        on the data (:func:`raydp_hpo.trainables.data.dataset_fingerprint`), so ``DPTuner`` on
        the same data charges the same ledger."""
        raise NotImplementedError  # each source names itself

    def ledger_name(self) -> str:
        """Name of the dataset's default ledger: ``data-<source>-<12 hex of the fingerprint>``."""
        from raydp_hpo.trainables.data import dataset_ledger_name

        return dataset_ledger_name(self.fingerprint())

    @property
    def sizes_accepted(self) -> bool:
        """Whether realised (private) sizes are accepted as public (Parquet ``sizes_public``)."""
        return False


class Mnist1dData(_DataBase):
    """MNIST-1D (Greydanus 2020), generated locally."""

    source: Literal["mnist1d"]
    size: Annotated[int, Field(ge=10), BeforeValidator(integer(10))] | None = Field(
        None, description=f"number of samples (default {_MNIST1D_SIZE})")
    generator_seed: Int = Field(42, description="seed of the MNIST-1D generator")

    @property
    def samples(self) -> int:
        return self.size or _MNIST1D_SIZE

    def public_total(self) -> int:
        return self.samples

    def fingerprint(self) -> str:
        from raydp_hpo.trainables.data import dataset_fingerprint

        return dataset_fingerprint(self.source, size=self.samples,
                                   generator_seed=self.generator_seed)


class DigitsData(_DataBase):
    """scikit-learn's bundled digits (1,797 records)."""

    source: Literal["digits"]

    def public_total(self) -> int:
        return _DIGITS_SIZE

    def fingerprint(self) -> str:
        from raydp_hpo.trainables.data import dataset_fingerprint

        return dataset_fingerprint(self.source)


def _columns(value: Any) -> Any:
    if not isinstance(value, list) or not value or not all(
        isinstance(c, str) and c for c in value
    ):
        fail(f"must be a non-empty list of column names, got {value!r}")
    return value


#: JSON Schema: ``sizes_public`` is not ``true`` (absent or false).
_NOT_SIZES_PUBLIC: dict[str, Any] = {
    "not": {"properties": {"sizes_public": {"const": True}}, "required": ["sizes_public"]}}


class ParquetData(_DataBase):
    """Parquet from any URI pyarrow reads (local path, file://, s3://, gs://, hdfs://).

    ``val_uri`` / ``test_uri`` name separate files for the validation / test split instead of
    splitting them off ``uri`` (those files are private data too). The budget belongs to
    ``uri`` (its ledger); a validation or test file is accounted as part of that dataset."""

    # the declarations the parser requires (_declared, below), for editors that read the schema
    model_config = ConfigDict(json_schema_extra={"allOf": [
        {"if": _NOT_SIZES_PUBLIC, "then": {"required": ["declared_train_size", "num_classes"]}},
        {"if": {"allOf": [_NOT_SIZES_PUBLIC, {"anyOf": [
            {"required": ["val_uri"]},
            {"not": {"properties": {"val_fraction": {"const": 0}}, "required": ["val_fraction"]}},
        ]}]}, "then": {"required": ["declared_validation_size"]}},
    ]})

    source: Literal["parquet"]
    uri: Text = Field(description="the training data (split unless val_uri/test_uri are given)")
    val_uri: Text | None = Field(None, description="validation split from this file instead "
                                 "of val_fraction of uri (private data too)")
    test_uri: Text | None = Field(None, description="test split from this file instead of "
                                  "test_fraction of uri (private data too)")
    label_column: Text = Field(description="integer class ids")
    feature_columns: Annotated[tuple[str, ...], BeforeValidator(_columns)] | None = Field(
        None, description="one numeric column per feature; default: every column but the label")
    feature_column: Text | None = Field(
        None, description="one list-valued column holding each row's feature vector")
    num_classes: Annotated[int, Field(ge=2), BeforeValidator(integer(2))] | None = Field(
        None, description="the number of classes (PUBLIC: the model's output width); required "
                          "unless data.sizes_public: true, which reads max(label) + 1 off the data")
    sizes_public: Bool = Field(
        False, description="accept the realised split sizes and max(label) + 1 of the private "
                           "data as public where none is declared (the certificate lists them "
                           "as treated as public); default: declare them")

    @property
    def sizes_accepted(self) -> bool:
        return self.sizes_public

    def fingerprint(self) -> str:
        from raydp_hpo.trainables.data import dataset_fingerprint

        return dataset_fingerprint(self.source, uri=self.uri)

    @model_validator(mode="after")
    def _consistent(self) -> ParquetData:
        if self.feature_columns is not None and self.feature_column is not None:
            fail("{path}: give at most one of data.feature_columns (one numeric column per "
                 "feature) or data.feature_column (a list column); without either, every "
                 "column but the label is a feature")
        self._disjoint()
        return self

    @model_validator(mode="before")
    @classmethod
    def _split_files(cls, data: Any) -> Any:
        """A split read from its own file takes nothing off ``uri``: its fraction is 0 (and
        may not be given)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for split, name in (("val", "validation"), ("test", "test")):
            if out.get(f"{split}_uri") is None:
                continue
            if f"{split}_fraction" in out:
                fail(f"{{path}}: data.{split}_uri is the {name} split, so data.{split}_fraction "
                     "(a share of data.uri) does not apply; drop one of them")
            out[f"{split}_fraction"] = 0.0
        return out

    @model_validator(mode="after")
    def _declared(self) -> ParquetData:
        """A Parquet table's size and label range are private: the public quantities read off
        them (split sizes, number of classes) are declared, or accepted with sizes_public."""
        if self.sizes_public:
            return self
        missing = [name for name, needed in (
            ("declared_train_size", self.declared_train_size is None),
            ("declared_validation_size", self.declared_validation_size is None
             and (self.val_uri is not None or self.val_fraction > 0)),
            ("num_classes", self.num_classes is None),
        ) if needed]
        if missing:
            fail("{path}: " + ", ".join(f"data.{m}" for m in missing) + " missing: the sizes and "
                 "labels of Parquet data are private (one record added or removed changes "
                 "them), so the normalisers and the model's output width need declared public "
                 "values; declare " + ", ".join(f"data.{m}" for m in missing) + ", or set "
                 "data.sizes_public: true to accept the realised values as public (the "
                 "certificate then lists them as treated as public). `raydp-hpo run --dry-run` "
                 "with sizes_public: true prints the realised values")
        return self

    def _disjoint(self) -> None:
        """Refuse a validation or test file that is the training file (or each other): the
        splits must be disjoint, or the selection and its evaluation see training records."""
        files = {"uri": self.uri, "val_uri": self.val_uri, "test_uri": self.test_uri}
        seen: dict[str, str] = {}
        for key, uri in files.items():
            if uri is None:
                continue
            canonical = canonical_uri(uri)
            if canonical in seen:
                other = seen[canonical]
                fail(f"{{path}}.{key} {uri!r} is the same file as {{path}}.{other} "
                     f"{files[other]!r} ({canonical}): validation and test data must be "
                     f"disjoint from the training data and from each other. Name a separate "
                     f"file in {{path}}.{key}, or drop it to split "
                     f"{{path}}.{key.replace('_uri', '_fraction')} off {{path}}.uri")
            seen[canonical] = key


DataModel = Annotated[Mnist1dData | DigitsData | ParquetData, Field(discriminator="source")]
DATA_MODELS: dict[str, type[_DataBase]] = {
    "mnist1d": Mnist1dData, "digits": DigitsData, "parquet": ParquetData,
}
#: The keys every data source has, listed after a source's own ones.
COMMON_DATA_KEYS = tuple(_DataBase.model_fields)
