//! Any bytes a peer may send: decoded by the wire codec and, if they decode, handled by a node
//! (`gossamer::cluster::fuzzing::frame`), which must neither panic nor let a peer poison a count.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gossamer::cluster::fuzzing::frame(data);
});
