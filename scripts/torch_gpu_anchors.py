"""PyTorch anchors for kiln's GPU benchmarks, measured the way kiln-gpu measures, in the same call.

GEMM: C = A @ B, square n x n, inputs uniform in [-1, 1) rounded to the type, three untimed products,
then every repetition timed on the host to the device's completion (synchronize), as kiln-gpu does;
f32 is true f32 (TF32 off, as candle's default), tf32 f32 with TF32 allowed. Copy: dst.copy_(src) on the device, bytes read plus
written, as the issue's 4.3 TB/s figure counts them. Triad: torch.add(b, c, alpha=3, out=a) (one kernel),
three arrays' bytes counted, as kiln-gpu's triad kernel counts them.

Usage: python3 torch_gpu_anchors.py [--device cuda:0] [--n 8192] [--reps 20] [--dtypes bf16,f16,f32,tf32,fp8]
                                    [--copy-mib 2048] [--sweep SHAPES]
Prints one JSON document on stdout; {"error": ...} and exit 2 where it cannot measure.
"""
import argparse
import json
import statistics
import sys
import time


def timed(fn, reps, sync):
    for _ in range(3):
        fn()
    sync()
    seconds = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        seconds.append(time.perf_counter() - t)
    return seconds


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dtypes", default="bf16,f16,f32,tf32,fp8")
    p.add_argument("--copy-mib", type=int, default=2048)
    # kiln-gpu's DEFAULT_SWEEP: the best of these is PyTorch's ceiling, beside kiln's.
    p.add_argument("--sweep", default="", help="shapes N or MxNxK, comma-separated, in the first dtype")
    a = p.parse_args()
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"error": f"no PyTorch in {sys.executable}: {e}"}))
        return 2
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": f"PyTorch {torch.__version__} sees no CUDA device"}))
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    types = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "tf32": torch.float32,
             "fp8": getattr(torch, "float8_e4m3fn", None)}
    gen = torch.Generator(device="cpu").manual_seed(1)
    doc = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "gemm": [],
    }
    for name in a.dtypes.split(","):
        dt = types[name]
        if name == "fp8":
            # e4m3 operands, a bf16 result, unit scales, no fast accumulation: what kiln-gpu's fp8
            # asks of cuBLASLt, through torch._scaled_mm (the second operand column-major, as
            # cuBLASLt's fp8 kernels take it). Only where the GPU has fp8 (compute capability 8.9+).
            if dt is None or device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
                doc.setdefault("skipped", []).append("fp8: no fp8 tensor cores or no float8 in this PyTorch")
                continue
            x = (torch.rand(a.n, a.n, generator=gen) * 2 - 1).to(device).to(dt)
            y = (torch.rand(a.n, a.n, generator=gen) * 2 - 1).to(device).to(dt).t().contiguous().t()
            one = torch.ones((), dtype=torch.float32, device=device)
            seconds = timed(lambda: torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                            a.reps, sync)
        else:
            # tf32: f32 operands on the tensor cores, as kiln-gpu's tf32 asks of cuBLAS.
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
            x = (torch.rand(a.n, a.n, generator=gen) * 2 - 1).to(dt).to(device)
            y = (torch.rand(a.n, a.n, generator=gen) * 2 - 1).to(dt).to(device)
            seconds = timed(lambda: torch.matmul(x, y), a.reps, sync)
        flops = 2.0 * a.n ** 3
        doc["gemm"].append({
            "dtype": name,
            "n": a.n,
            "seconds": seconds,
            "tflops_median": flops / statistics.median(seconds) / 1e12,
            "tflops_best": flops / min(seconds) / 1e12,
        })
        del x, y
    if a.sweep:
        name = a.dtypes.split(",")[0]
        dt = types[name]
        doc["sweep"] = []
        for text in a.sweep.split(","):
            dims = [int(d) for d in text.split("x")]
            m, n, k = dims * 3 if len(dims) == 1 else dims
            x = (torch.rand(m, k, device=device) * 2 - 1).to(dt)
            y = (torch.rand(k, n, device=device) * 2 - 1).to(dt)
            seconds = timed(lambda: torch.matmul(x, y), a.reps, sync)
            doc["sweep"].append({
                "dtype": name,
                "shape": f"{m}x{n}x{k}",
                "tflops_median": 2.0 * m * n * k / statistics.median(seconds) / 1e12,
            })
            del x, y
    torch.backends.cuda.matmul.allow_tf32 = False
    elements = a.copy_mib * (1 << 20) // 4
    src = torch.ones(elements, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), a.reps, sync)
    moved = 2 * elements * 4
    doc["copy"] = {
        "bytes_read_and_written": moved,
        "seconds": seconds,
        "gbps_median": moved / statistics.median(seconds) / 1e9,
        "gbps_best": moved / min(seconds) / 1e9,
    }
    b, c = src, torch.ones_like(src)
    seconds = timed(lambda: torch.add(b, c, alpha=3.0, out=dst), a.reps, sync)
    moved = 3 * elements * 4
    doc["triad"] = {
        "bytes_counted": moved,
        "seconds": seconds,
        "gbps_median": moved / statistics.median(seconds) / 1e9,
        "gbps_best": moved / min(seconds) / 1e9,
    }
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
