"""Pure data, no engine and no I/O: the store's schema, the Arrow batch of metric rows, CSVLogger's
layout rebuilt from long rows, the wire encoding of a batch shared by the channel and spill files (wire; wire_v1
reads the first one, in old spill files), side-table rows."""
