"""The embedded default collection that ``rlfb demo`` runs on, generated from a seed.

It describes fictional devices. Two kinds of questions are asked about them,
so that no single retriever wins everywhere and the fusion weights matter:

* **code** questions name a part code ("What is the rated pressure of KX-4471?"):
  exact tokens that BM25 matches and a small dense model blurs;
* **paraphrase** questions describe the device in other words ("which machine
  circulates cooling fluid ..."), which a dense model matches and BM25 does not.

Every device has one full description (grade 2) and one short service note
(grade 1); distractor notes mention the same words about other devices.

>>> data = generate_demo_corpus(n_devices=20, seed=1)
>>> len(data.corpus), len(data.queries), len(set(data.queries.values()))
(60, 40, 40)
>>> data == generate_demo_corpus(n_devices=20, seed=1)
True
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlfb.datasets import BeirDataset
from rlfb.errors import ValidationError
from rlfb.types import Chunk

__all__ = ["generate_demo_corpus", "MAX_DEVICES"]

# (what the device does in the documents' words, the same in a question's words)
_FUNCTIONS = [
    ("pumps coolant through reactor cores", "circulates cooling fluid inside nuclear reactors"),
    ("filters dust from factory air", "cleans particles out of the atmosphere in plants"),
    ("measures wind speed on offshore platforms", "gauges how fast the breeze blows at sea rigs"),
    ("stores electricity for night use", "keeps power banked until after dark"),
    ("desalinates seawater for drinking", "turns ocean brine into potable water"),
    ("detects gas leaks in pipelines", "notices escaping fuel in long ducts"),
    ("sorts parcels in warehouses", "arranges packages by destination in depots"),
    ("cools data centre servers", "keeps computer racks from overheating"),
    ("drills boreholes for geothermal wells", "bores deep shafts to tap underground heat"),
    ("monitors heart rhythm in patients", "tracks the cardiac beat of people in hospital"),
    ("compresses natural gas for transport", "squeezes methane so it can be shipped"),
    ("tracks satellites from the ground", "follows orbiting spacecraft from earth stations"),
    ("irrigates fields with drip lines", "waters crops slowly through small tubes"),
    ("recycles plastic bottles into fibre", "turns used drink containers into thread"),
    ("scans luggage at airports", "inspects suitcases for travellers at terminals"),
    ("welds steel beams on bridges", "joins metal girders on river crossings"),
]
_MATERIALS = ["titanium", "ceramic", "carbon fibre", "stainless steel", "aluminium", "graphene"]
_CITIES = ["Oslo", "Lyon", "Osaka", "Porto", "Quito", "Tartu", "Perth", "Cork", "Graz", "Brno"]
_NAMES = ["Veltrano", "Oskari", "Marlow", "Quenby", "Dastra", "Ilvane", "Korvex", "Tessel", "Brumal", "Zephine",
          "Hallorn", "Pyrrin", "Calder", "Morvane", "Sitka", "Fennick"]
_ATTRIBUTES = [
    ("rated pressure", "bar", 5, 400),
    ("operating temperature", "degrees", 40, 900),
    ("service interval", "hours", 100, 5000),
    ("rated power", "kilowatts", 2, 800),
]


@dataclass(frozen=True)
class _Device:
    code: str
    name: str
    function: tuple[str, str]
    material: str
    city: str
    year: int
    attribute: tuple[str, str, int]


def _device(rng: random.Random, i: int, function: tuple[str, str], material: str) -> _Device:
    letters = "".join(rng.choice("BCDFGHKLMNPRSTVXZ") for _ in range(2))
    attr, unit, lo, hi = rng.choice(_ATTRIBUTES)
    return _Device(
        code=f"{letters}-{1000 + i * 37}",  # unique: i * 37 never repeats
        name=f"{rng.choice(_NAMES)} {rng.choice(['Mk', 'Series', 'Model'])} {rng.randrange(2, 9)}",
        function=function,
        material=material,
        city=rng.choice(_CITIES),
        year=rng.randrange(1975, 2025),
        attribute=(attr, unit, rng.randrange(lo, hi)),
    )


MAX_DEVICES = len(_FUNCTIONS) * len(_MATERIALS)  # one device per (function, material) pair: 96


def generate_demo_corpus(n_devices: int = 90, seed: int = 7) -> BeirDataset:
    """A seeded BEIR-style collection: 3 documents per device and 2 questions per device.

    The ``test`` split holds every question; simulations split it in halves. ``n_devices`` is 2 to
    :data:`MAX_DEVICES`: each device has a (function, material) pair of its own, so that a paraphrase
    question has one right answer, and its comparison note names another device.
    """
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or not 2 <= n_devices <= MAX_DEVICES:
        # past 96 two devices shared a pair: "which carbon fibre machine keeps computer racks from
        # overheating?" described two devices and judged one of them; two questions could read alike
        raise ValidationError(f"n_devices must be an int in [2, {MAX_DEVICES}], got {n_devices!r}")
    rng = random.Random(seed)
    # every (function, material) pair once, so that no two devices share a paraphrase question
    pairs = [(f, m) for f in _FUNCTIONS for m in _MATERIALS]
    rng.shuffle(pairs)
    devices = [_device(rng, i, *pairs[i]) for i in range(n_devices)]
    # the comparison note names a device 7 places on, another one (7 devices: 7 places on is itself)
    step = 7 % n_devices or 1
    corpus: list[Chunk] = []
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for i, d in enumerate(devices):
        attr, unit, value = d.attribute
        full = (
            f"The {d.name} ({d.code}) {d.function[0]}. Built in {d.city} in {d.year}, its housing is "
            f"{d.material}. The {attr} of {d.code} is {value} {unit}."
        )
        note = f"Service note for {d.code}: check the {d.material} seals and log the {attr} after each shift."
        other = devices[(i + step) % n_devices]
        distractor = (
            f"Unlike the {other.code}, a unit that {d.function[0]} is often rebuilt in {other.city}; "
            f"engineers compare the {attr} of several models."
        )
        corpus += [
            Chunk(f"d{i}-full", full, {"device": d.code, "kind": "description"}),
            Chunk(f"d{i}-note", note, {"device": d.code, "kind": "service note"}),
            Chunk(f"d{i}-other", distractor, {"device": other.code, "kind": "comparison"}),
        ]
        queries[f"q{i}-code"] = f"What is the {attr} of {d.code}?"
        # devices share functions and materials, so a paraphrase question is hard, but never repeated
        queries[f"q{i}-para"] = f"Which {d.material} machine {d.function[1]}?"
        qrels[f"q{i}-code"] = {f"d{i}-full": 2, f"d{i}-note": 1}
        qrels[f"q{i}-para"] = {f"d{i}-full": 2}
    return BeirDataset("rlfb-demo", corpus, queries, {"test": qrels})
