// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

interface IEscrowWithdraw {
    function withdraw(address token) external;
}

/// @notice Test-only worker that refuses every ETH transfer, to prove a reverting payee
///         cannot block a release batch and cannot pull its deferred balance either.
contract RevertingReceiver {
    error NoEther();

    receive() external payable {
        revert NoEther();
    }

    function pull(address escrow) external {
        IEscrowWithdraw(escrow).withdraw(address(0));
    }

    /// @dev EIP-1271: this test wallet consents to every slot it is offered.
    function isValidSignature(bytes32, bytes calldata) external pure returns (bytes4) {
        return 0x1626ba7e;
    }
}
