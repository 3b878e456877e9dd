"""sinew.steps: the step functions of the usual case, a classifier trained with cross-entropy on tensors in memory.

    from sinew.steps import classifier
    train_step, evaluate = classifier(model, train_x, train_y, test_x, test_y)
    summary = job.run(model, len(train_x), train_step, evaluate, len(test_x))
"""
import torch
import torch.nn.functional as F

__all__ = ["classifier"]


def classifier(model, train_x, train_y, test_x=None, test_y=None, chunk=500):
    """(train_step, evaluate) for Job.run.

    train_step(indices): the mean cross-entropy of `model` over train_x[indices] against train_y[indices],
    after its backward(); the indices go to the tensors' device. evaluate(first, last): the summed loss and
    the number of correct predictions (arg max) over test samples [first, last), `chunk` at a time (Job.run
    calls it with the module in eval mode and without gradients). Without test tensors, evaluate is None.
    """
    def train_step(indices):
        idx = torch.tensor(indices, device=train_x.device)
        loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
        loss.backward()
        return loss.item()

    def evaluate(first, last):
        loss, correct = 0.0, 0
        for s in range(first, last, chunk):
            x, y = test_x[s:min(s + chunk, last)], test_y[s:min(s + chunk, last)]
            out = model(x)
            loss += F.cross_entropy(out, y, reduction="sum").item()
            correct += int((out.argmax(1) == y).sum())
        return loss, correct

    return train_step, (evaluate if test_x is not None else None)
