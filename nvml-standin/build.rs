//! The stand-in is loaded as the driver's library is: by its soname.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
