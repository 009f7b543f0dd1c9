"""A transformers program (Trainer on a tiny GPT-2 built from a config: nothing downloaded; DDP on
CPU, gloo) with the one callback that gives it slurmgen's heartbeats, timeline, metrics and
curves (marked `slurmgen:`). The Trainer reads the launcher's environment (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR/PORT) itself.

    python examples/transformers_gpt2.py [max_steps]
"""

import gc
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from slurmgen.integrations.transformers import SlurmgenCallback  # slurmgen: line 1 of 2

VOCAB, LENGTH = 64, 16


class Tokens(torch.utils.data.Dataset):
    """Sequences counting up modulo the vocabulary: a language a model learns in a few steps."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        ids = (torch.arange(LENGTH) + i) % VOCAB
        return {"input_ids": ids, "labels": ids}


def main(max_steps: int) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=1, n_head=2))
    args = TrainingArguments(
        output_dir=os.environ.get("OUT_DIR", "hf_out"),
        max_steps=max_steps,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        learning_rate=1e-3,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=max_steps // 2,
        save_steps=max_steps // 2,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(),
        eval_dataset=torch.utils.data.Subset(Tokens(), range(16)),
        callbacks=[SlurmgenCallback()],  # slurmgen: line 2 of 2
    )
    trainer.train()
    print(f"rank {args.process_index} of {args.world_size}: done", flush=True)
    if torch.distributed.is_initialized():
        # The Trainer leaves its process group to interpreter shutdown, where gloo (CPU) aborts
        # now and then (exit 134) after training finished; docs/troubleshooting.md has the why.
        # Wait for every rank (rank 0 may still be saving), drop the DDP model, then destroy.
        torch.distributed.barrier()
        del trainer, model
        gc.collect()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
