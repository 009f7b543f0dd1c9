"""An Accelerate program (its own loop, DDP on CPU, gloo) with the two lines of `slurmgen.beat`
that give it slurmgen's heartbeats, timeline and metrics (marked `slurmgen:`): Accelerate runs
no loop of its own, so it needs no callback. `Accelerator` reads the launcher's environment
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT); run it as `python`, not `accelerate launch`.

    python examples/accelerate_loop.py [max_steps]
"""

import sys

import torch
from accelerate import Accelerator

from slurmgen import beat  # slurmgen: line 1 of 2


def main(max_steps: int) -> None:
    accelerator = Accelerator(cpu=True)
    beat(phase="rendezvous")  # optional: Accelerator() has joined the process group
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    step = 0
    while step < max_steps:
        for xb, yb in data:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            # slurmgen: line 2 of 2 (loss as a number on the main process only: no sync elsewhere)
            beat(step=step, loss=loss.item() if accelerator.is_main_process else None)
            if step == max_steps:
                break
    rank, world = accelerator.process_index, accelerator.num_processes
    print(f"rank {rank} of {world} local {accelerator.local_process_index}: done", flush=True)
    # Free the DDP model (it holds the process group in reference cycles; the accelerator keeps
    # references too) before destroying the group: a group left to interpreter shutdown makes gloo
    # (CPU) abort now and then after the last step (exit 134; docs/troubleshooting.md).
    accelerator.wait_for_everyone()
    model, optimizer, data = accelerator.free_memory(model, optimizer, data)  # and gc.collect()
    accelerator.end_training()  # destroys the process group


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
