"""Datasets and loaders; below the engine, which iterates them, and knowing nothing of it.

    bundle      DataBundle (what every loader returns), DataError, shared checks
    cifar       32x32 classification: digits, CIFAR-10/100, image folders
    folders     train/ and test/ class folders, found and opened
    imagenet    ImageNet-style folders at any image size
    text        character-level text (the offline Python-source corpus or a file) for lm.py
    images      decoding any image file as RGB; unreadable files skipped or refused
    decoded     image folders decoded once into a uint8 cache
    loaders     DataLoaders with rank sharding and keyed augmentation
    augment     DataLoader augmentation independent of the worker count
    fingerprint a dataset's classes, counts and sizes, checked on resume
    downloads   partial downloads removed on failure
"""
from .bundle import DataBundle, DataError
from .cifar import load

__all__ = ["DataBundle", "DataError", "load"]
