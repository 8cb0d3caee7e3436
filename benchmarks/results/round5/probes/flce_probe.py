import os, sys, torch
sys.path.insert(0, "tests")
dev = os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu")
import npu_liger
from test_fused_linear_cross_entropy import reference
worst = (0, None)
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 300):
    x = torch.randn(1, 8, device=dev); w = torch.randn(1, 8, device=dev) * 8 ** -0.5 * 2
    t = torch.zeros(1, dtype=torch.long, device=dev)
    opts = (-100, "none", 0.0, 5.0, 1e-3)
    loss = npu_liger.fused_linear_cross_entropy(x, w, t, None, *opts)
    ce = npu_liger.cross_entropy(x @ w.T, t, *opts)
    ref = reference(x.double(), w.double(), t, None, *opts)
    logit32 = (x @ w.T).item(); logit64 = (x.double() @ w.double().T).item()
    err = abs(loss.item() - ref.item()) / abs(ref.item())
    if err > worst[0]:
        worst = (err, dict(loss=loss.item(), ce=ce.item(), ref=ref.item(), logit32=logit32, logit64=logit64))
print(dev, worst)
