"""The metadata contract and the tools that make metadata.

Owns: reading and validating sharded length metadata (:mod:`.contract`: ``sample_id``,
``seq_len``, optional key columns; a Parquet footer believed only as far as its pages bear it
out, :mod:`.footer`), deriving it from a tokenized dataset (:mod:`.lengths`) with
the memory-mappable token copy (:mod:`.tokens`), synthetic datasets (:mod:`.synth`), shard
writing (:mod:`.shards`) and the length summary ``varpack check`` prints (:mod:`.summary`); the
token copy's index (:mod:`.token_index`, :mod:`.token_copies`) and the check values that verify
every sample read from it (:mod:`.token_check`).
May import: the ground floor (``varpack.errors``, ``atomic``, ``console``, ``fingerprint``),
pyarrow, NumPy, and numba for the check values. Nothing else in varpack; every later stage reads metadata through here.
"""

from varpack.metadata.contract import ID, LEN, Piece, read_metadata, resolve_files

__all__ = ["ID", "LEN", "Piece", "read_metadata", "resolve_files"]
