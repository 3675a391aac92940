"""The reader's vision-language rows: each micro-batch of a plan as a
:class:`~varpack.torch.vlm.VisionBatch`, made in the DataLoader workers from the user's
dataset (``PlanLoader(..., vision=config)``). The dataset returns each sample as its processor's
outputs (``input_ids``, ``mm_token_type_ids``, ``pixel_values``, ``image_grid_thw``, optional
``labels``): the processor runs where the dataset runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset

from varpack.errors import ConfigError, VarpackError
from varpack.torch.collate import Failed
from varpack.torch.vlm import read_vision, vision_settings


class VisionMicroBatches(Dataset[Any]):
    """Map-style dataset: ``(epoch, row)`` -> the :class:`~varpack.torch.vlm.VisionBatch` of
    that row, each sample the processor's outputs the user's dataset returns."""

    def __init__(self, rows: Any, dataset: Any, pad_id: int, merge: int, tps: float | None) -> None:
        self.rows, self.dataset, self.pad_id = rows, dataset, pad_id
        self.merge, self.tps = merge, tps

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, i: int, epoch: int = 0) -> Any:
        """The batch of row ``i`` (in this process)."""
        raw = self[(epoch, i)]
        if isinstance(raw, Failed):
            raise raw.error()
        return raw.to_batch()

    def __getitem__(self, index: tuple[int, int]) -> Ready | Failed:
        epoch, i = index
        try:
            row = self.rows.row(i, epoch)
            return Ready(read_vision(row, self.dataset, self.pad_id, self.merge, self.tps))
        except VarpackError as exc:  # sent back whole, as for text
            return Failed(type(exc), str(exc))


@dataclass(frozen=True)
class Ready:
    """A batch made whole in a DataLoader worker (tensors cross in shared memory)."""

    batch: Any

    def to_batch(self) -> Any:
        return self.batch


def check_vision_plan(where: str, layout: str, cp_size: int, config: dict[str, Any]) -> None:
    """Refuse, in one line, a plan a :class:`VisionMicroBatches` cannot read."""
    if layout != "packed" or cp_size > 1:
        raise ConfigError(f"{where}: vision= reads packed plans without --cp; this one is "
                          f"{layout}{' with --cp' if cp_size > 1 else ''}: plan with --layout packed")  # fmt: skip
    if config.get("oversize") == "split":
        raise ConfigError(f"{where}: the plan splits long samples (--oversize split), and a "
                          "sample with images cannot be split: plan with --oversize alone or error")  # fmt: skip


def vision_rows(where: str, layout: str, cp_size: int, config: dict[str, Any],
                rows: Any, dataset: Any, pad_id: int, vision: Any) -> VisionMicroBatches:  # fmt: skip
    """The rows of a plan a loader reads with ``vision`` (the model or its config), or one line
    saying why the plan cannot be read so."""
    check_vision_plan(where, layout, cp_size, config)
    merge, tps = vision_settings(vision)
    return VisionMicroBatches(rows, dataset, pad_id, merge, tps)
