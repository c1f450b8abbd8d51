"""A draft that accepts: an EAGLE-3 head for SmolLM2-135M-Instruct, trained here on the CPU (issue 40
item 2). A fixture builder for the real-engine tests and benchmarks, not a product command.

What it builds, once, under ``.cache/`` (reused while its recipe's hash is the same):
``.cache/smollm2-eagle3-<hash>/`` with three checkpoints of one training run, saved at growing
points of it so that they accept from little to much: ``early``, ``mid`` and ``final``; each in
the layout vLLM's ``LlamaForCausalLMEagle3`` loads (one decoder layer over the target's low,
middle and high hidden states, a reduced draft vocabulary with EAGLE-3's ``d2t`` offsets; the
embedding is the target's, shared by the engine), with ``train.json`` saying what it cost and how
often it agreed with the target on held-out text.

How (the script ``TRAIN`` below, run by the vLLM venv's python, which has torch and transformers):
1. the data, all local: prompts made from the Python standard library's docstrings (sorted, the
   same on every machine) under instructions of the kinds operators serve (summarise, explain,
   rewrite, write a function, answer), each through SmolLM2's chat template, answered greedily by
   SmolLM2 itself (batched ``generate``), kept past the end of the turn for the answer's whole
   length (what a fixed-length bench with ``ignore_eos`` reads); and windows of text the target
   reads as they are (no template, as the completions API sends them): the interpreter's own
   documentation (``pydoc_data``) and the standard library's code;
2. the features: SmolLM2 reads each sequence once; kept are the residual stream entering layers 2,
   15 and 27 (what vLLM hands an EAGLE-3 head: ``(2, L // 2, L - 3)``) and the target's own greedy
   choice at every position (the draft learns what the target would say, not the text);
3. a tenth of the sequences of each kind held out before anything is learnt: the draft vocabulary
   (the 4,096 tokens the target chose most often) comes from the rest, and held-out agreement is
   scored on the target's own answers (and, apart, on the text), a choice outside the vocabulary
   counting as a miss, so that it compares with the engine's acceptance;
4. the head: vLLM's EAGLE-3 Llama layer written out in torch (fc over the three states; the layer
   reads ``[norm(embedding of the next token), norm(state)]``; the final norm; the head over the
   draft vocabulary, initialised from the target's tied embedding), trained with EAGLE-3's
   training-time test: three draft steps unrolled, each step's query attending to the first step's
   keys up to its position and to its own earlier steps' keys at that position, as the engine's
   draft cache holds them.

Run ``python -m tuitune_support.real_draft`` to build it ahead (it builds SmolLM2 first if needed).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tuitune_support import real_vllm

# the recipe: every number that changes what is built (its hash names the folder)
RECIPE = {
    "version": 3,
    "prompts": 128,  # answered greedily by the target
    "new_tokens": 96,  # each answer's length, kept past the end-of-turn (what a fixed-length bench reads)
    "gen_batch": 32,
    "raw_windows": {"prose": 54, "code": 46},  # windows of local text the target reads (no template)
    "raw_window": 512,  # tokens a window
    "feat_batch": 8,
    "aux_layers": [2, 15, 27],  # SmolLM2 has 30 layers: vLLM's default (2, 30 // 2, 30 - 3)
    "draft_vocab": 4096,
    "chunk": 256,  # training sequence length
    "ttt_steps": 3,
    "steps": 500,
    "batch": 4,
    "lr": 2e-3,
    "seed": 7,
    "saves": {"early": 40, "mid": 150, "final": 500},
    "held_out": 0.1,
}
DIGEST = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:10]
DRAFT = real_vllm.CACHE / f"smollm2-eagle3-{DIGEST}"
CHECKPOINTS = tuple(RECIPE["saves"])  # early, mid, final


def say(msg: str) -> None:
    print(f"real-draft: {msg}", file=sys.stderr, flush=True)


TRAIN = r'''
import json, math, random, sys, sysconfig, time, ast
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

target_dir, out, R = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
torch.manual_seed(R["seed"]); random.seed(R["seed"])
T0 = time.monotonic()
def say(m): print(f"[{time.monotonic() - T0:6.0f} s] {m}", file=sys.stderr, flush=True)

tok = AutoTokenizer.from_pretrained(target_dir)
tok.padding_side = "left"
model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
cfg = model.config
H, V = cfg.hidden_size, cfg.vocab_size

# ---- 1. prompts from local text, answered by the target itself -------------------------------------
lib = Path(sysconfig.get_paths()["stdlib"])
docs = []
for p in sorted(lib.glob("*.py")):
    try:
        tree = ast.parse(p.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        continue
    for node in [tree] + [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]:
        d = ast.get_docstring(node)
        if d and 120 <= len(d) <= 900:
            docs.append((getattr(node, "name", p.stem), " ".join(d.split())))
random.shuffle(docs)
asks = [
    "Summarize this text in two sentences:\n\n{doc}",
    "Explain this to a new programmer:\n\n{doc}",
    "Rewrite the following in plain English:\n\n{doc}",
    "List the key points of this text:\n\n{doc}",
    "Write a short Python function named {name} that does what this describes:\n\n{doc}",
    "Answer briefly: what is {name} for, according to this?\n\n{doc}",
]
prompts = []
for i, (name, doc) in enumerate(docs[: R["prompts"]]):
    text = asks[i % len(asks)].format(name=name, doc=doc)
    prompts.append(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False))
say(f"{len(prompts)} prompts from {len(docs)} docstrings of the standard library")
prompts.sort(key=lambda p: len(tok(p, add_special_tokens=False)["input_ids"]))  # batches of like length: little padding
seqs = []  # (token ids, the index of the first token the target chose: its own answer)
gcfg = model.generation_config
gcfg.eos_token_id, gcfg.do_sample, gcfg.pad_token_id = None, False, tok.pad_token_id  # past the end of turn
gcfg.max_new_tokens = gcfg.min_new_tokens = R["new_tokens"]
with torch.no_grad():
    for b in range(0, len(prompts), R["gen_batch"]):
        enc = tok(prompts[b : b + R["gen_batch"]], return_tensors="pt", padding=True, add_special_tokens=False)
        gen = model.generate(**enc, generation_config=gcfg)
        width = enc["input_ids"].shape[1]
        for row, mask in zip(gen, enc["attention_mask"]):
            prompt = row[:width][mask.bool()].tolist()
            seqs.append((prompt + row[width:].tolist(), len(prompt)))
        say(f"generated {len(seqs)}/{len(prompts)}")
gen_s = time.monotonic() - T0

# ---- 1b. local text read as it is: prose (the interpreter's own documentation) and code -------------------
import pydoc_data.topics as topics
W = R["raw_window"]
raw = []
for kind, texts in (
    ("prose", [topics.topics[k] for k in sorted(topics.topics)]),
    ("code", [p.read_text(encoding="utf-8", errors="replace") for p in sorted(lib.glob("*.py"))]),
):
    stream = tok("\n\n".join(texts), add_special_tokens=False)["input_ids"]
    windows = [stream[a : a + W] for a in range(0, len(stream) - W, W)]
    random.shuffle(windows)
    raw += [(w, 0) for w in windows[: R["raw_windows"][kind]]]
    say(f"{kind}: {min(len(windows), R['raw_windows'][kind])} windows of {W} tokens (of {len(windows)})")

# ---- 2. the target's states at the aux layers and its own greedy choices ----------------------------
A = R["aux_layers"]
feats, toks, ys, firsts = [], [], [], []
def read(group):
    """A batch of sequences padded on the right: causal attention keeps each one's own tokens from seeing
    the padding after them, so no mask is needed and each is read as if alone."""
    n = max(len(ids) for ids, _ in group)
    x = torch.tensor([ids + [tok.pad_token_id] * (n - len(ids)) for ids, _ in group])
    o = model(input_ids=x, output_hidden_states=True)
    for j, (ids, first) in enumerate(group):
        m = len(ids)
        feats.append(torch.cat([o.hidden_states[a][j, :m] for a in A], -1).to(torch.bfloat16))
        toks.append(x[j, :m]); ys.append(o.logits[j, :m].argmax(-1)); firsts.append(first)
with torch.no_grad():
    for group in (seqs, raw):  # the answers (sorted by length already), then the windows of text
        for b in range(0, len(group), R["feat_batch"]):
            read(group[b : b + R["feat_batch"]])
    say(f"features of {len(toks)} sequences")
n_tokens = sum(len(t) for t in toks)
n_answer = sum(len(ids) - first for ids, first in seqs)
feat_s = time.monotonic() - T0 - gen_s
say(f"{n_tokens} tokens of features")

# ---- held out: whole sequences (a tenth of each kind), before anything is learnt from the data -------
order = list(range(len(toks))); random.shuffle(order)
kinds = {"answers": [i for i in order if i < len(seqs)], "raw": [i for i in order if i >= len(seqs)]}
held_ids = {i for ids in kinds.values() for i in ids[: max(2, int(len(ids) * R["held_out"]))]}

# ---- the draft vocabulary: the tokens the target chose most often (training sequences only) ---------
counts = torch.bincount(torch.cat([ys[i] for i in range(len(ys)) if i not in held_ids]), minlength=V)
Vd = R["draft_vocab"]
keep = torch.sort(torch.topk(counts, Vd).indices).values  # draft id -> target id, ascending
d2t = keep - torch.arange(Vd)  # EAGLE-3's offsets: target = draft + d2t[draft]
t2d = torch.full((V,), Vd, dtype=torch.long); t2d[keep] = torch.arange(Vd)  # Vd: outside, never right
held_choices = torch.cat([ys[i] for i in held_ids])
covered = (t2d[held_choices] < Vd).float().mean().item()
say(f"draft vocabulary {Vd}: {covered:.1%} of the target's choices on held-out text")

# ---- 3. the head, as vLLM's Eagle3 Llama layer computes it ---------------------------------------------
heads, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
inter, eps, theta = cfg.intermediate_size, cfg.rms_norm_eps, cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") and cfg.rope_parameters else cfg.rope_theta

class Norm(nn.Module):
    def __init__(self, n, w=None):
        super().__init__(); self.weight = nn.Parameter(w.clone() if w is not None else torch.ones(n))
    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

def rope(x, pos):  # x: (B, h, T, hd); Llama's rotate-half
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    f = pos[..., None].float() * inv  # (B, T, hd/2)
    cos, sin = torch.cat([f, f], -1).cos()[:, None], torch.cat([f, f], -1).sin()[:, None]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin

class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(len(A) * H, H, bias=False)
        self.q_proj = nn.Linear(2 * H, heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, kv * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, kv * hd, bias=False)
        self.o_proj = nn.Linear(heads * hd, H, bias=False)
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)
        self.input_layernorm, self.hidden_norm, self.post_attention_layernorm = Norm(H), Norm(H), Norm(H)
        self.norm = Norm(H, model.model.norm.weight.detach())
        self.lm_head = nn.Linear(H, Vd, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(model.lm_head.weight[keep])
            nn.init.normal_(self.o_proj.weight, std=0.002); nn.init.normal_(self.down_proj.weight, std=0.002)

    def qkv(self, emb, hid, pos):
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hid)], -1)
        B, T, _ = x.shape
        q = rope(self.q_proj(x).view(B, T, heads, hd).transpose(1, 2), pos)
        k = rope(self.k_proj(x).view(B, T, kv, hd).transpose(1, 2), pos)
        v = self.v_proj(x).view(B, T, kv, hd).transpose(1, 2)
        return q, k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)

    def rest(self, attn, hid):
        B, _, T, _ = attn.shape
        r = self.o_proj(attn.transpose(1, 2).reshape(B, T, heads * hd)) + hid  # residual: the state itself
        m = self.post_attention_layernorm(r)
        pre = self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m)) + r
        return self.lm_head(self.norm(pre)), pre  # logits, and the state the next step reads

embed = model.model.embed_tokens.weight.detach()

def unrolled(head, feat, tok_next, pos, steps):
    """Training-time test: step s's query at i sees step 1's keys at <= i and steps 2..s's keys at i."""
    B, T, _ = feat.shape
    hid = head.fc(feat)
    out, K, Vv = [], [], []
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for s in range(steps):
        emb = F.embedding(tok_next[:, s : s + T], embed)
        q, k, v = head.qkv(emb, hid, pos + s)
        K.append(k); Vv.append(v)
        sc = [(q @ K[0].transpose(-1, -2)) / math.sqrt(hd)]
        sc[0] = sc[0].masked_fill(~causal, float("-inf"))
        sc += [((q * K[j]).sum(-1, keepdim=True)) / math.sqrt(hd) for j in range(1, s + 1)]
        w = torch.cat(sc, -1).softmax(-1)
        attn = w[..., :T] @ Vv[0] + sum(w[..., T + j - 1 : T + j] * Vv[j] for j in range(1, s + 1))
        logits, hid = head.rest(attn, hid)
        out.append(logits)
    return out

# chunks: (features at t, the tokens after t for each step, the target's choice after each, the first
# position, the first label that is the target's own answer: what agreement is scored on)
L, S = R["chunk"], R["ttt_steps"]
train, held = [], {"answers": [], "raw": []}
for n, (f, t, y, first) in enumerate(zip(feats, toks, ys, firsts)):
    for a in range(0, len(t) - S - 1, L):
        b = min(a + L, len(t) - S - 1)
        if b - a >= 32:
            c = (f[a:b], t[a + 1 : b + S], y[a + 1 : b + S], a, max(0, first - 2 - a) if first else 0)
            if n not in held_ids:
                train.append(c)
            elif first == 0 or b + S > first:
                held["answers" if first else "raw"].append(c)
random.shuffle(train)
say(f"{len(train)} training chunks; held out: {len(held['answers'])} with answers, {len(held['raw'])} of text")

def batch(items, answers_only):
    T = max(len(c[0]) for c in items)
    f = torch.zeros(len(items), T, len(A) * H); tn = torch.zeros(len(items), T + S - 1, dtype=torch.long)
    y = torch.full((len(items), T + S - 1), -100, dtype=torch.long); pos = torch.zeros(len(items), T, dtype=torch.long)
    for i, (fi, ti, yi, a, scored) in enumerate(items):
        n = len(fi)
        f[i, :n] = fi.float(); tn[i, : n + S - 1] = ti; y[i, : n + S - 1] = t2d[yi]; pos[i, :n] = torch.arange(a, a + n)
        if answers_only:  # held-out agreement counts only the target's answers; training learns from all
            y[i, :scored] = -100
    return f, tn, y, pos

def losses(head, items, answers_only=False):
    f, tn, y, pos = batch(items, answers_only)
    outs = unrolled(head, f, tn, pos, S)
    ls, acc = [], []
    for s, lg in enumerate(outs):
        ys_ = y[:, s : s + lg.shape[1]]
        ls.append(F.cross_entropy(lg.reshape(-1, Vd), ys_.masked_fill(ys_ == Vd, -100).reshape(-1), ignore_index=-100))
        ok = ys_ != -100  # a choice outside the draft vocabulary counts, as a miss
        acc.append(((lg.argmax(-1) == ys_) & ok).sum().item() / max(1, ok.sum().item()))
    return ls, acc

head = Head()
params = [p for n, p in head.named_parameters()]
opt = torch.optim.AdamW(params, lr=R["lr"], weight_decay=0.0)
steps = R["steps"]
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 30) * 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps)))
saves = {v: k for k, v in R["saves"].items()}
report = {"tokens": n_tokens, "answer_tokens": n_answer, "answers": len(seqs), "text_windows": len(raw),
          "held_out_vocab_coverage": round(covered, 4), "generate_s": round(gen_s), "features_s": round(feat_s),
          "checkpoints": {}}

def evaluate():
    head.eval()
    got = {}
    with torch.no_grad():
        for kind, cs in held.items():
            accs = [losses(head, cs[i : i + 8], True)[1] for i in range(0, len(cs), 8)]
            got[kind] = [round(sum(a[s] for a in accs) / max(1, len(accs)), 4) for s in range(S)]
    head.train()
    return got

def save(name):
    d = out / name; d.mkdir(parents=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    w = {"fc.weight": sd["fc.weight"], "norm.weight": sd["norm.weight"], "lm_head.weight": sd["lm_head.weight"]}
    for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
        w[f"layers.0.self_attn.{n}.weight"] = sd[f"{n}.weight"]
    for n in ("gate_proj", "up_proj", "down_proj"):
        w[f"layers.0.mlp.{n}.weight"] = sd[f"{n}.weight"]
    for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        w[f"layers.0.{n}.weight"] = sd[f"{n}.weight"]
    w["d2t"] = d2t.contiguous(); w["t2d"] = (t2d >= 0).contiguous()
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    conf = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": hd, "hidden_act": "silu", "rms_norm_eps": eps,
        "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": V, "draft_vocab_size": Vd,
        "rope_theta": theta, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "target_hidden_size": H,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": A, "use_aux_hidden_state": True},
    }
    (d / "config.json").write_text(json.dumps(conf, indent=2))
    acc = evaluate()
    report["checkpoints"][name] = {"step": i + 1, "held_out_agreement_per_step": acc, "train_s": round(time.monotonic() - t_train)}  # answers: on the target's own answers only
    say(f"saved {name} at step {i + 1}: held-out agreement per draft step {acc}")

t_train = time.monotonic()
head.train()
for i in range(steps):
    items = [train[(i * R["batch"] + j) % len(train)] for j in range(R["batch"])]
    ls, acc = losses(head, items)
    loss = sum(l * (0.8 ** s) for s, l in enumerate(ls))
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step(); sched.step()
    if (i + 1) % 50 == 0:
        say(f"step {i + 1}/{steps}: loss {loss.item():.3f}, agreement {[round(a, 3) for a in acc]}")
    if i + 1 in saves:
        save(saves[i + 1])
report["train_s"] = round(time.monotonic() - t_train)
report["total_s"] = round(time.monotonic() - T0)
(out / "train.json").write_text(json.dumps(report, indent=1))
print(json.dumps(report))
'''


def build_draft(python: Path | None = None) -> Path:
    """The trained heads' folder (``early``, ``mid``, ``final`` and ``train.json``), built once under a
    lock, in a temporary folder renamed into place. Raises Unreachable without a registry (SmolLM2
    comes from one), RuntimeError when training fails."""
    stamp = json.dumps(RECIPE, sort_keys=True)
    if real_vllm._built(DRAFT, stamp):
        return DRAFT
    python = python or real_vllm.build_env()
    target = real_vllm.build_smollm2(python)
    with real_vllm._locked(DRAFT.name):
        if real_vllm._built(DRAFT, stamp):
            return DRAFT
        tmp = real_vllm._fresh_tmp(DRAFT)
        tmp.mkdir(parents=True)
        t0 = time.monotonic()
        say(f"training an EAGLE-3 head for SmolLM2 into {DRAFT} (on the CPU, about 13 minutes on 2 cores)")
        proc = subprocess.Popen(
            [str(python), "-c", TRAIN, str(target), str(tmp), json.dumps(RECIPE)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                **real_vllm.ENV,
                "OMP_NUM_THREADS": str(os.cpu_count() or 1),
                "TOKENIZERS_PARALLELISM": "false",
            },
        )
        assert proc.stderr is not None and proc.stdout is not None
        tail: list[str] = []
        for line in proc.stderr:
            tail = (tail + [line.rstrip()])[-40:]
            if line.startswith("["):
                say(line.rstrip())
        out = proc.stdout.read()
        if proc.wait() != 0:
            raise RuntimeError("training the EAGLE-3 head failed: " + "\n".join(tail)[-1500:])
        report = json.loads(out.strip().splitlines()[-1])
        (tmp / ".built").write_text(stamp + "\n")
        real_vllm._install_into_place(tmp, DRAFT)
        say(f"ready ({time.monotonic() - t0:.0f} s): {report['checkpoints']}")
    return DRAFT


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(
        prog="python -m tuitune_support.real_draft", description=__doc__.split("\n\n")[0]
    ).parse_args()
    try:
        print(build_draft())
    except real_vllm.Unreachable as e:
        print(f"the EAGLE-3 head was not trained: the package registry is unreachable ({e})")
