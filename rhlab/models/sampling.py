"""The sampling settings: the run config's `sampling` section, and what the sampler (generate) and the
vLLM engine take. Kept apart from sampler.py so that loading a config does not import torch."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class SamplingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    max_new_tokens: int = Field(64, gt=0, description="completion length limit in tokens")
    temperature: float = Field(1.0, gt=0,
        description="sampling temperature; log-probs are of softmax(logits / temperature)")
    top_k: int = Field(0, ge=0, description="keep the k most likely tokens when sampling; 0 = off")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass; 1 = off")
    repetition_penalty: float = Field(1.0, gt=0, description="HF semantics; sampling only, not in the loss")
    backend: Literal["auto", "fast", "hf", "vllm"] = Field("auto",
        description="fast = LLaMA static-cache runner; hf = transformers generate; auto = fast when it applies; "
                    "vllm = a colocated vLLM engine (GPU only, rhlab[vllm]; docs/performance.md)")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="vllm only: its share of the GPU memory")
    vllm_max_model_len: Optional[int] = Field(None, gt=0,
        description="vllm only: prompt + completion tokens; None = the model's")
