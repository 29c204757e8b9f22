"""What an attempt measures of itself: peak memory, gradient bytes."""

from __future__ import annotations


def peak_memory_bytes() -> int:
    """CUDA max allocated on a GPU; peak RSS of this process on CPU."""
    import resource

    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def gradient_bytes(trainer) -> int:
    """Bytes of gradients one backward pass allocates, measured on a training batch."""
    model = trainer.model
    batch = next(iter(trainer.get_train_dataloader()))
    batch = trainer._prepare_inputs(batch)
    model.train()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    total = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)
    return int(total)
