//! Sets the linker flags a Node addon needs (undefined `napi_*` symbols resolved by the
//! node binary at load time).
fn main() {
    napi_build::setup();
}
