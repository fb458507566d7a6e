"""The recording trainers: the GRPO layer's and PACS's trainers that keep the batch each training generation hands to
training, as assembled (after the monitors, before the split path's exchange), in `trainer.batches`. One definition
for the dynamic sampling tests (tests/test_dynamic_sampling.py, tests/test_dynamic_sampling_paths.py) and the vLLM
tier (tests/vllm_tier/test_dynamic_sampling_vllm.py)."""

import torch

from pacs import PACSTrainer
from pacs.grpo import HardenedGRPOTrainer


class Recording:
    """Records the batch each generation hands to training (after assembly, before the split path's exchange)."""

    def _after_monitors(self, output, mode):
        output = super()._after_monitors(output, mode)
        if mode == "train":
            self.batches = getattr(self, "batches", [])
            self.batches.append({k: v.clone() for k, v in output.items() if isinstance(v, torch.Tensor)})
        return output


class RecordingGRPO(Recording, HardenedGRPOTrainer):
    pass


class RecordingPACS(Recording, PACSTrainer):
    pass
