"""PyTorch anchor for kiln's reference training benchmark, with the model's sizes as arguments.

A copy of the team's anchors/torch_train.py (the anchor the issue measured, fixed at the `anchor`
size) whose only change is that the sizes come from the command line, so that benches/train.rs
can compare every named size: python torch_train.py STEPS MODE VOCAB D_MODEL LAYERS HEADS SEQ BATCH,
and, as a tenth argument, the device (`cpu`, the default, or `cuda:0`: scripts/gpu-check.sh's
anchor for `kiln-gpu train`; each step is timed to the device's completion), and as an eleventh
the products' precision on a GPU: `bf16` (torch.autocast, f32 parameters, as kiln's mixed
precision), `tf32` or `f32`.


A GPT-style decoder-only LM (vocab 256, d_model 256, 4 layers, 4 heads, seq 128, batch 8, 3.3 M params),
AdamW, and a seeded synthetic corpus (next = 5*prev+17 mod 256 with p=3/4, else uniform; optimal loss ~1.94).
Usage: python torch_train.py [STEPS] [eager|sdpa|compile]; prints a RESULT line with tokens/s.
Run it right beside the candle benchmark, interleaved, with the same configuration and compare the ratio.
"""
import math, sys, time, statistics
import torch, torch.nn as nn, torch.nn.functional as F

VOCAB, D_MODEL, N_LAYER, N_HEAD, SEQ, BATCH = (int(v) for v in (sys.argv[3:9] if len(sys.argv) >= 9 else (256, 256, 4, 4, 128, 8)))
DEVICE = torch.device(sys.argv[9] if len(sys.argv) >= 10 else "cpu")
PRODUCTS = sys.argv[10] if len(sys.argv) >= 11 else "f32"
if DEVICE.type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = PRODUCTS == "tf32"
    torch.backends.cudnn.allow_tf32 = PRODUCTS == "tf32"
MASK64 = (1 << 64) - 1

class Lcg:
    def __init__(self, s): self.s = s
    def next(self):
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) & MASK64
        return self.s >> 33

def batch(rng):
    xs, ys = [], []
    for _ in range(BATCH):
        prev = rng.next() % VOCAB
        seq = [prev]
        for _ in range(SEQ):
            nxt = (prev * 5 + 17) % VOCAB if rng.next() % 4 != 0 else rng.next() % VOCAB
            seq.append(nxt); prev = nxt
        xs.append(seq[:SEQ]); ys.append(seq[1:])
    return torch.tensor(xs), torch.tensor(ys)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.qkv, self.proj = nn.Linear(D_MODEL, 3 * D_MODEL), nn.Linear(D_MODEL, D_MODEL)
        self.fc, self.fc2 = nn.Linear(D_MODEL, 4 * D_MODEL), nn.Linear(4 * D_MODEL, D_MODEL)
    def forward(self, x, mask, sdpa):
        b, t, c = x.shape; hd = c // N_HEAD
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, N_HEAD, hd).permute(2, 0, 3, 1, 4)
        if sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # explicit, op-for-op like the candle version
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + mask
            y = att.softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.randn(SEQ, D_MODEL) * 0.02)
        self.blocks = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.register_buffer("mask", torch.full((SEQ, SEQ), float("-inf")).triu(1))
    def forward(self, idx, sdpa):
        x = self.tok(idx) + self.pos
        for b in self.blocks: x = b(x, self.mask, sdpa)
        return self.head(self.ln_f(x))

def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    mode = sys.argv[2] if len(sys.argv) > 2 else "eager"   # eager | sdpa | compile
    torch.manual_seed(0)
    model = Gpt().to(DEVICE)
    nparams = sum(p.numel() for p in model.parameters())
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    print(f"torch {torch.__version__} device={DEVICE} products={PRODUCTS} threads={torch.get_num_threads()} interop={torch.get_num_interop_threads()} cpu_cap={torch.backends.cpu.get_cpu_capability()} params={nparams} mode={mode}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    sdpa = mode in ("sdpa", "compile")
    fwd = torch.compile(model) if mode == "compile" else model
    rng = Lcg(42); warm = 3; times, losses = [], []
    for step in range(warm + steps):
        x, y = batch(rng)
        x, y = x.to(DEVICE), y.to(DEVICE)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=PRODUCTS == "bf16"):
            logits = fwd(x, sdpa)
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        l = loss.item()
        sync()
        dt = time.perf_counter() - t0
        if step >= warm: times.append(dt)
        losses.append(l)
        if step % 10 == 0 or step == warm + steps - 1: print(f"step {step:4d} loss {l:.4f} {dt*1e3:.1f} ms")
    med = statistics.median(times)
    print(f"RESULT torch-{mode} steps={steps} median_step_ms={med*1e3:.1f} mean_step_ms={statistics.mean(times)*1e3:.1f} "
          f"tokens_per_s_median={BATCH*SEQ/med:.0f} loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f}")

if __name__ == "__main__":
    main()
