# mypy: ignore-errors
"""A user's Hugging Face Trainer script, the way the transformers examples (run_clm.py) resume: nothing of ddpjob.

A tiny GPT-2 built from a GPT2Config (no download), a random-token dataset from a fixed seed, Trainer with
save_steps/save_total_limit, and `trainer.train(resume_from_checkpoint=get_last_checkpoint(out))`: the newest
checkpoint-N directory under --out, or None when there is none. Run by torchrun (gloo, CPU), any number of
processes. Each process prints RESUMED_FROM=<checkpoint dir or none>, each step `step N/M`; rank 0 ends with
FINAL_PARAMS_SHA256=<sha256 of the parameters, in named_parameters order, as float32 bytes>.

usage: torchrun ... hf_trainer.py [--out DIR] [--steps N] [--save-every N] [--step-sleep S] [--seed N]
"""

import argparse
import hashlib
import os
import time

# No network: everything is built locally; these keep the hub from being asked for anything.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint


def say(line):
    """One line in one write: the ranks share stdout, and under PYTHONUNBUFFERED print() writes the text and its
    newline separately, so lines of two ranks could interleave."""
    print(line + "\n", end="", flush=True)


class RandomTokens(Dataset):
    """Fixed random token sequences (a language-modelling dataset stand-in): the same on every run and rank."""

    def __init__(self, size, length, vocab, seed):
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (size, length), generator=generator)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, index):
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class StepPrinter(TrainerCallback):
    """Prints each optimizer step and sleeps after it (--step-sleep: room to inject faults mid-run)."""

    def __init__(self, rank, sleep):
        self.rank, self.sleep = rank, sleep

    def on_step_end(self, args, state, control, **kwargs):
        say(f"[rank{self.rank}] step {state.global_step}/{state.max_steps}")
        if self.sleep:
            time.sleep(self.sleep)

    def on_save(self, args, state, control, **kwargs):
        say(f"[rank{self.rank}] saved checkpoint-{state.global_step}")


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():  # registration order; tied weights once
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    parser = argparse.ArgumentParser(description="Hugging Face Trainer on a tiny GPT-2")
    parser.add_argument("--out", default="/checkpoints/hf", help="TrainingArguments.output_dir (checkpoint-N)")
    parser.add_argument("--steps", type=int, default=60, help="max_steps")
    parser.add_argument("--save-every", type=int, default=20, help="save_steps")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of sleep after each step")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))

    set_seed(args.seed)  # before the model is built: its initial weights come from this seed
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    # 256 samples, 4 per process: 32 steps per epoch with 2 processes, so a default run spans two epochs and a
    # resume lands mid-epoch (the Trainer skips the batches already seen).
    dataset = RandomTokens(size=256, length=32, vocab=config.vocab_size, seed=args.seed)

    training_args = TrainingArguments(
        output_dir=args.out,
        max_steps=args.steps,
        save_strategy="steps",
        save_steps=args.save_every,
        save_total_limit=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        seed=args.seed,
        data_seed=args.seed,
        full_determinism=True,
        dataloader_num_workers=0,
        dataloader_drop_last=True,
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        report_to=[],
        logging_steps=args.save_every,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset,
                      callbacks=[StepPrinter(rank, args.step_sleep)])

    last = get_last_checkpoint(args.out) if os.path.isdir(args.out) else None
    say(f"RESUMED_FROM={last or 'none'}")
    trainer.train(resume_from_checkpoint=last)

    if rank == 0:
        say(f"FINAL_PARAMS_SHA256={params_sha256(model)}")


if __name__ == "__main__":
    main()
