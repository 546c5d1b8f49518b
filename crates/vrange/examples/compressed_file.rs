//! Serves a zstd-compressed file as one flat decompressed byte array in a refill region: the
//! decompressor client of the 2014 design. Only the compressed blocks stay in ordinary memory;
//! decompressed blocks live in the region, where the system takes them back whenever it needs
//! the memory and the next access decompresses them again.
//!
//!     cargo run --release -p vrange --example compressed_file -- FILE [READS]
//!
//! FILE is compressed here in independent 256 KiB blocks (zstd level 3), then READS random
//! offsets (default 100,000) are read through the region and checked against the file. Run it
//! in a memory cgroup smaller than FILE to see blocks taken back and made again (`fills`
//! counts them).

use std::time::Instant;

const BLOCK: usize = 256 << 10;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: compressed_file FILE [READS]")?;
    let reads: usize = args.next().map_or(Ok(100_000), |r| r.parse())?;
    let original = std::fs::read(&path)?;
    if original.is_empty() {
        return Err("the file is empty".into());
    }
    // Independent blocks: any one decompresses alone.
    let blocks: Vec<Vec<u8>> = original
        .chunks(BLOCK)
        .map(|b| zstd::bulk::compress(b, 3))
        .collect::<Result<_, _>>()?;
    let compressed: usize = blocks.iter().map(Vec::len).sum();
    println!(
        "{path}: {} bytes, {} compressed in {} blocks",
        original.len(),
        compressed,
        blocks.len()
    );
    // The verification below keeps the original too; a real server would drop it here.
    let region = vrange::RefillRegion::new(original.len(), BLOCK, move |offset, buf| {
        // The last block is shorter; the region ends on a page boundary: zero the tail.
        match zstd::bulk::decompress_to_buffer(&blocks[offset / BLOCK], buf) {
            Ok(n) => {
                buf[n..].fill(0);
                true
            }
            Err(_) => false,
        }
    })?;
    let t0 = Instant::now();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..reads {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = x as usize % original.len();
        // SAFETY: inside the region; a read of a missing block waits for its decompression.
        let byte = unsafe { region.as_ptr().add(at).read_volatile() };
        if byte != original[at] {
            return Err(format!("byte {at} differs").into());
        }
    }
    let s = vrange::stats();
    println!(
        "{reads} random reads checked in {:.2} s; {} blocks decompressed ({} bytes), {} failed",
        t0.elapsed().as_secs_f64(),
        s.refill_fills,
        s.refill_bytes,
        s.refill_failures
    );
    Ok(())
}
