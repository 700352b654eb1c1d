"""A GGUF model with only its first N blocks: the same kind of model, small enough to carry to a GPU machine.

usage: trim_gguf.py IN.gguf OUT.gguf N   (with the sdist's gguf-py on PYTHONPATH; scripts/gpu-check/prepare does it)
Its text is nonsense; its tensors, tokenizer and KV geometry are the original's, which is what the check needs.
"""

import sys

import gguf


def trim(src: str, dst: str, blocks: int) -> None:
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = blocks if field.name == f"{arch}.block_count" else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub_type)
    keep = [t for t in reader.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < blocks]
    for t in keep:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in keep:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()


if __name__ == "__main__":
    trim(sys.argv[1], sys.argv[2], int(sys.argv[3]))
