"""Small built-in models for the recipes. Any torch.nn.Module with a `_target_` works the same way."""

from runner.models.bag_of_ngrams import BagOfNgrams
from runner.models.gpt import GPT
from runner.models.mlp import MLP
from runner.models.pretrained import from_pretrained
from runner.models.resnet import ImagePreprocess, ResNet
from runner.models.seq_transformer import SeqTransformer
from runner.models.text_classifier import TextClassifier

__all__ = ["BagOfNgrams", "GPT", "MLP", "SeqTransformer", "from_pretrained", "ImagePreprocess", "ResNet",
           "TextClassifier"]
