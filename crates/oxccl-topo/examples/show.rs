fn main() {
    let arg = std::env::args().nth(1).unwrap();
    let t = if arg.ends_with(".xml") {
        oxccl_topo::Topology::from_xml_file(&arg).unwrap()
    } else {
        oxccl_topo::Topology::preset(&arg, 1).unwrap()
    };
    print!("{}{}", t.summary(), t.matrix_report(0));
}
