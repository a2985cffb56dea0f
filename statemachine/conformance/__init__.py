"""The reference-model tools for other implementations.

`schemas` exports the JSON Schemas of the spec, the documents, the commands and
replies; `runner` runs scenarios through the reference and records them as
vectors; `scenarios` holds the seed behaviours; `vectors` generates the vector
file and its coverage; `conform` holds another implementation to the vectors.
"""
