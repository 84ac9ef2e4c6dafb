"""MTCNN from facenet-pytorch 2.6.0, the face cascade's real models and its reference pipeline.

The wheel ships the three nets as PyTorch state dicts (facenet_pytorch/data/{p,r,o}net.pt) and
its detection in facenet_pytorch/models/utils/detect_face.py, which imports torchvision and PIL
(neither imports here). So the nets are written again below in plain PyTorch (the same layers
and names as facenet_pytorch/models/mtcnn.py, so its state dicts load with weights_only=True),
exported to ONNX as a third party would (P-Net with a free height and width, R-Net and O-Net
with a free batch), and `detect` is detect_face for one photo with torch ops: the same scale
pyramid, torch's "area" resampling, bounding-box regression, squaring, crops clipped to the
photo, thresholds and NMS (torchvision's batched_nms written with torch ops; the last one
facenet's own nms_numpy with "Min").
"""

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.functional import interpolate

WHEEL = "facenet-pytorch"
DATA = "facenet_pytorch/data/"
THRESHOLDS = (0.6, 0.7, 0.7)
MIN_FACE = 20
FACTOR = 0.709


class PNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 10, kernel_size=3)
        self.prelu1 = nn.PReLU(10)
        self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(10, 16, kernel_size=3)
        self.prelu2 = nn.PReLU(16)
        self.conv3 = nn.Conv2d(16, 32, kernel_size=3)
        self.prelu3 = nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, kernel_size=1)
        self.softmax4_1 = nn.Softmax(dim=1)
        self.conv4_2 = nn.Conv2d(32, 4, kernel_size=1)

    def forward(self, x):
        x = self.prelu1(self.conv1(x))
        x = self.pool1(x)
        x = self.prelu2(self.conv2(x))
        x = self.prelu3(self.conv3(x))
        return self.conv4_2(x), self.softmax4_1(self.conv4_1(x))


class RNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 28, kernel_size=3)
        self.prelu1 = nn.PReLU(28)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(28, 48, kernel_size=3)
        self.prelu2 = nn.PReLU(48)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(48, 64, kernel_size=2)
        self.prelu3 = nn.PReLU(64)
        self.dense4 = nn.Linear(576, 128)
        self.prelu4 = nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.softmax5_1 = nn.Softmax(dim=1)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x):
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.prelu3(self.conv3(x))
        x = x.permute(0, 3, 2, 1).contiguous()
        x = self.prelu4(self.dense4(x.view(x.shape[0], -1)))
        return self.dense5_2(x), self.softmax5_1(self.dense5_1(x))


class ONet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3)
        self.prelu1 = nn.PReLU(32)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.prelu2 = nn.PReLU(64)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(64, 64, kernel_size=3)
        self.prelu3 = nn.PReLU(64)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv4 = nn.Conv2d(64, 128, kernel_size=2)
        self.prelu4 = nn.PReLU(128)
        self.dense5 = nn.Linear(1152, 256)
        self.prelu5 = nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.softmax6_1 = nn.Softmax(dim=1)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x):
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu4(self.conv4(x))
        x = x.permute(0, 3, 2, 1).contiguous()
        x = self.prelu5(self.dense5(x.view(x.shape[0], -1)))
        return self.dense6_2(x), self.dense6_3(x), self.softmax6_1(self.dense6_1(x))


def nets(data: Path) -> dict[str, nn.Module]:
    """{"pnet", "rnet", "onet"} with the wheel's weights, from *data* (its data folder)."""
    out = {}
    for name, cls in (("pnet", PNet), ("rnet", RNet), ("onet", ONet)):
        net = cls()
        net.load_state_dict(torch.load(data / f"{name}.pt", weights_only=True))
        out[name] = net.eval()
    return out


def export(data: Path, folder: Path) -> dict[str, Path]:
    """The three nets as .onnx files in *folder* (made once): P-Net's height and width free,
    R-Net's and O-Net's batch free."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.onnx" for name in ("pnet", "rnet", "onet")}
    if all(p.is_file() for p in paths.values()):
        return paths
    made = nets(data)
    specs = {"pnet": ((1, 3, 120, 160), ["reg", "prob"], {0: "batch", 2: "height", 3: "width"}),
             "rnet": ((1, 3, 24, 24), ["reg", "prob"], {0: "batch"}),
             "onet": ((1, 3, 48, 48), ["reg", "landmarks", "prob"], {0: "batch"})}
    for name, (shape, outputs, axes) in specs.items():
        tmp = paths[name].with_suffix(".tmp")
        torch.onnx.export(made[name], (torch.zeros(shape),), str(tmp), input_names=["image"],
                          output_names=outputs, opset_version=17, dynamo=False,
                          dynamic_axes={"image": axes, **{o: {0: "batch"} for o in outputs}})
        tmp.rename(paths[name])
    return paths


# ---------------------------------------------------------------------------------------------
# detect_face for one photo


def nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """torchvision.ops.nms: the best first, a box dropped when its IoU (areas without +1) with
    a kept one is over *threshold*."""
    order = torch.argsort(scores, descending=True, stable=True)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep = []
    while len(order):
        i = order[0]
        keep.append(int(i))
        rest = order[1:]
        xx1 = torch.maximum(boxes[i, 0], boxes[rest, 0])
        yy1 = torch.maximum(boxes[i, 1], boxes[rest, 1])
        xx2 = torch.minimum(boxes[i, 2], boxes[rest, 2])
        yy2 = torch.minimum(boxes[i, 3], boxes[rest, 3])
        inter = (xx2 - xx1).clamp(min=0) * (yy2 - yy1).clamp(min=0)
        order = rest[inter / (area[i] + area[rest] - inter) <= threshold]
    return torch.as_tensor(keep, dtype=torch.long)


def nms_min(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> np.ndarray:
    """facenet's nms_numpy(..., 'Min'): areas with +1, overlap over the smaller area."""
    x1, y1, x2, y2 = (boxes[:, k].copy() for k in range(4))
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = np.argsort(scores)
    pick = []
    while order.size > 0:
        i = order[-1]
        pick.append(i)
        idx = order[:-1]
        w = np.maximum(0.0, np.minimum(x2[i], x2[idx]) - np.maximum(x1[i], x1[idx]) + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2[idx]) - np.maximum(y1[i], y1[idx]) + 1)
        inter = w * h
        order = idx[inter / np.minimum(area[i], area[idx]) <= threshold]
    return np.asarray(pick, dtype=np.int64)


def _bbreg(boxes, reg):
    w = boxes[:, 2] - boxes[:, 0] + 1
    h = boxes[:, 3] - boxes[:, 1] + 1
    boxes[:, :4] = torch.stack([boxes[:, 0] + reg[:, 0] * w, boxes[:, 1] + reg[:, 1] * h,
                                boxes[:, 2] + reg[:, 2] * w, boxes[:, 3] + reg[:, 3] * h], 1)
    return boxes


def _rerec(boxes):
    h = boxes[:, 3] - boxes[:, 1]
    w = boxes[:, 2] - boxes[:, 0]
    side = torch.max(w, h)
    boxes[:, 0] = boxes[:, 0] + w * 0.5 - side * 0.5
    boxes[:, 1] = boxes[:, 1] + h * 0.5 - side * 0.5
    boxes[:, 2:4] = boxes[:, :2] + side.repeat(2, 1).permute(1, 0)
    return boxes


def _crops(img, boxes, w, h, size):
    b = boxes.trunc().int().numpy()
    x, y, ex, ey = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    x[x < 1], y[y < 1] = 1, 1
    ex[ex > w], ey[ey > h] = w, h
    out = [interpolate(img[:, :, y[k] - 1:ey[k], x[k] - 1:ex[k]], size=(size, size), mode="area")
           for k in range(len(b)) if ey[k] > y[k] - 1 and ex[k] > x[k] - 1]
    return (torch.cat(out) - 127.5) * 0.0078125


@torch.no_grad()
def detect(image: np.ndarray, run: dict) -> dict:
    """{"faces": [{"box", "score", "landmarks"}]} of one RGB photo (H, W, 3 uint8), as
    facenet-pytorch's detect_face finds them (min_face 20, factor 0.709, thresholds 0.6, 0.7,
    0.7); *run*: {"pnet", "rnet", "onet"} callables, tensor in -> tuple of tensors out (the
    PyTorch nets, or sessions on their ONNX)."""
    img = torch.as_tensor(image.copy()).permute(2, 0, 1)[None].float()
    h, w = img.shape[2:4]
    m = 12.0 / MIN_FACE
    minl = min(h, w) * m
    scales, scale = [], m
    while minl >= 12:
        scales.append(scale)
        scale, minl = scale * FACTOR, minl * FACTOR
    found = []
    for scale in scales:
        level = interpolate(img, size=(int(h * scale + 1), int(w * scale + 1)), mode="area")
        reg, probs = run["pnet"]((level - 127.5) * 0.0078125)
        probs = probs[0, 1]
        mask = probs >= THRESHOLDS[0]
        cells = mask.nonzero()
        bb = cells.float().flip(1)
        q1 = ((2 * bb + 1) / scale).floor()
        q2 = ((2 * bb + 12) / scale).floor()
        boxes = torch.cat([q1, q2, probs[mask][:, None], reg[0][:, mask].permute(1, 0)], 1)
        found.append(boxes[nms(boxes[:, :4], boxes[:, 4], 0.5)])
    boxes = torch.cat(found) if found else torch.zeros(0, 9)
    boxes = boxes[nms(boxes[:, :4], boxes[:, 4], 0.7)]
    if len(boxes):
        regw, regh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]   # no +1 here
        boxes = _rerec(torch.stack([boxes[:, 0] + boxes[:, 5] * regw,
                                    boxes[:, 1] + boxes[:, 6] * regh,
                                    boxes[:, 2] + boxes[:, 7] * regw,
                                    boxes[:, 3] + boxes[:, 8] * regh, boxes[:, 4]], 1))
        reg, prob = run["rnet"](_crops(img, boxes, w, h, 24))
        ok = prob[:, 1] > THRESHOLDS[1]
        boxes = torch.cat([boxes[ok, :4], prob[ok, 1:2]], 1)
        reg = reg[ok]
        pick = nms(boxes[:, :4], boxes[:, 4], 0.7)
        boxes = _rerec(_bbreg(boxes[pick], reg[pick]))
    faces = []
    if len(boxes):
        reg, points, prob = run["onet"](_crops(img, boxes, w, h, 48))
        ok = prob[:, 1] > THRESHOLDS[2]
        boxes, reg, points = torch.cat([boxes[ok, :4], prob[ok, 1:2]], 1), reg[ok], points[ok]
        bw = boxes[:, 2] - boxes[:, 0] + 1
        bh = boxes[:, 3] - boxes[:, 1] + 1
        px = bw[:, None] * points[:, :5] + boxes[:, 0:1] - 1
        py = bh[:, None] * points[:, 5:] + boxes[:, 1:2] - 1
        boxes = _bbreg(boxes, reg)
        keep = nms_min(boxes[:, :4].numpy(), boxes[:, 4].numpy(), 0.7)
        for k in keep:
            faces.append({"box": [float(v) for v in boxes[k, :4]], "score": float(boxes[k, 4]),
                          "landmarks": [[float(px[k, i]), float(py[k, i])] for i in range(5)]})
    return {"faces": faces}


def torch_runner(made: dict[str, nn.Module]) -> dict:
    return {name: (lambda x, net=net: net(x)) for name, net in made.items()}


def onnx_runner(paths: dict[str, Path]) -> dict:
    """detect's *run* over onnxruntime sessions on the exported .onnx files."""
    import onnxruntime as ort

    out = {}
    for name, path in paths.items():
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

        def run(x, session=session):
            return tuple(torch.as_tensor(o) for o in session.run(None, {"image": x.numpy()}))
        out[name] = run
    return out
